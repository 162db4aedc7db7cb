# Stand-in for prom/prometheus (tests only): Debian bookworm's Prometheus 2.42 at the official
# image's /bin/prometheus, run as `nobody` with its data in /prometheus; wget for the healthcheck.
FROM yue2-offline/debian:bookworm
RUN mkdir -p /prometheus /etc/prometheus && chown nobody:nogroup /prometheus
USER nobody
WORKDIR /prometheus
ENTRYPOINT ["/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
