# Stand-in for redis:7 (tests only): Debian bookworm's Redis 7.0, run as `redis` in /data, with
# the official image's `--protected-mode no` (the compose network is the boundary).
FROM yue2-offline/debian:bookworm
RUN mkdir -p /data && chown redis:redis /data
WORKDIR /data
COPY redis-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]
CMD ["redis-server"]
