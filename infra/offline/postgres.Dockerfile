# Stand-in for postgres:16 (tests only): Debian bookworm's PostgreSQL 15 with an entrypoint that
# does what the official image's does for this stack (POSTGRES_USER, _PASSWORD, _DB on first start,
# password logins from the network, the server run as `postgres`).
FROM yue2-offline/debian:bookworm
# Debian's package made a cluster at install (on 5433 when the debootstrap host had 5432 taken),
# and its client wrappers then aim at that port: drop it, so pg_isready asks 5432 like the real image.
RUN for v in $(ls /etc/postgresql); do pg_dropcluster "$v" main; done
COPY postgres-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
ENV PGDATA=/var/lib/postgresql/data
STOPSIGNAL SIGINT
ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]
