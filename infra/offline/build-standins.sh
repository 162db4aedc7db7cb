#!/usr/bin/env bash
# Builds, without any image registry, stand-ins for the images docker-compose.yml pulls, for
# `make test-compose` (infra/compose.offline.yml swaps them in; the real file keeps the real images):
#
#   yue2-offline/debian:bookworm   debootstrap of Debian bookworm from $DEBIAN_MIRROR, `docker import`ed,
#                                  with python3, PostgreSQL, Redis and Prometheus from Debian's packages
#   yue2-offline/python:3.11       python:3.11-slim: a venv of Debian's python3.11 plus a wheelhouse
#                                  (`pip wheel` here, on the host) that pip installs from with no index
#   yue2-offline/postgres:16       postgres:16 (Debian's 15 behind the official image's entrypoint contract)
#   yue2-offline/redis:7           redis:7 (Debian's 7.0)
#   yue2-offline/moto:5            minio/minio and minio/mc: moto's S3 server and a bucket script
#   yue2-offline/prometheus:2      prom/prometheus (Debian's 2.42)
#
# Everything is cached: the root filesystem tarball and the wheelhouse under $YUE2_OFFLINE_CACHE
# (the wheelhouse is rebuilt when pyproject.toml changes), the images in Docker (a second run
# takes seconds). Needs root (debootstrap), debootstrap, a running Docker engine and pip.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE=$ROOT/infra/offline
CACHE=${YUE2_OFFLINE_CACHE:-$HOME/.cache/yue2-offline}
# The host's own Debian mirror (apt's sources), unless told otherwise.
DEBIAN_MIRROR=${DEBIAN_MIRROR:-$(grep -rhoE '^(URIs:|deb) +https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list* 2>/dev/null |
  grep -oE 'https?://[^ ]+' | head -1)}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
PIP=${PIP:-$(command -v pip3 || command -v pip)}
PACKAGES=python3,python3-venv,postgresql,redis-server,prometheus,ca-certificates,wget,netbase
mkdir -p "$CACHE"

docker info >/dev/null 2>&1 || {
  echo "build-standins: no Docker engine answers (docker info); start dockerd first (docs/operations.md, The compose stack)" >&2
  exit 1
}

have_image() { docker image inspect "$1" >/dev/null 2>&1; }
say() { printf '[build-standins %s] %s\n' "$(date -u +%T)" "$*" >&2; }

base_image() {
  local tarball=$CACHE/bookworm-rootfs.tar stamp=$CACHE/bookworm-rootfs.packages
  if [ ! -s "$tarball" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$PACKAGES" ]; then
    command -v debootstrap >/dev/null || { echo "build-standins: needs debootstrap (apt-get install debootstrap)" >&2; exit 1; }
    say "debootstrap bookworm from $DEBIAN_MIRROR (a few minutes)"
    local dir=$CACHE/rootfs.tmp
    rm -rf "$dir"
    debootstrap --variant=minbase --include="$PACKAGES" bookworm "$dir" "$DEBIAN_MIRROR" >"$CACHE/debootstrap.log" 2>&1 ||
      { tail -20 "$CACHE/debootstrap.log" >&2; exit 1; }
    rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
    tar -C "$dir" --numeric-owner -cf "$tarball.tmp" .
    mv "$tarball.tmp" "$tarball"
    echo "$PACKAGES" >"$stamp"
    rm -rf "$dir"
    docker image rm yue2-offline/debian:bookworm >/dev/null 2>&1 || true
  fi
  if ! have_image yue2-offline/debian:bookworm; then
    say "docker import yue2-offline/debian:bookworm"
    docker import --change 'CMD ["/bin/bash"]' "$tarball" yue2-offline/debian:bookworm >/dev/null
  fi
}

wheelhouse() {
  # Every dependency of the package (torch's CPU wheel comes from pip's own configuration: a local
  # wheel directory here), setuptools for the image's wheel build, and moto for the S3 stand-in.
  # pip resolves for the host's Python; the image's is Debian's 3.11.2, for which redis also
  # wants async-timeout (a `python_full_version < "3.11.3"` marker).
  local ctx=$CACHE/python-context stamp
  local reqs=("torch==2.13.0" "moto[server]>=5" "setuptools>=68" wheel "async-timeout>=4.0.3")
  stamp=$({ echo "${reqs[*]}"; cat "$ROOT/pyproject.toml"; } | sha256sum | cut -c1-16)
  if [ "$(cat "$ctx/wheels.stamp" 2>/dev/null)" != "$stamp" ]; then
    say "pip wheel: the project's dependencies into $ctx/wheels"
    rm -rf "$ctx/wheels.tmp"
    mkdir -p "$ctx"
    "$PIP" wheel --quiet --wheel-dir "$ctx/wheels.tmp" "$ROOT" "${reqs[@]}"
    rm -f "$ctx"/wheels.tmp/yue2_jobs-*.whl  # the image builds its own from the build context
    rm -rf "$ctx/wheels"
    mv "$ctx/wheels.tmp" "$ctx/wheels"
    echo "$stamp" >"$ctx/wheels.stamp"
  fi
}

build() {  # build TAG DOCKERFILE CONTEXT (Docker's layer cache makes a rebuild a no-op)
  say "docker build $1"
  docker build --quiet --tag "$1" --file "$2" "$3" >/dev/null
}

base_image
wheelhouse
build yue2-offline/python:3.11 "$HERE/python.Dockerfile" "$CACHE/python-context"
build yue2-offline/postgres:16 "$HERE/postgres.Dockerfile" "$HERE"
build yue2-offline/redis:7 "$HERE/redis.Dockerfile" "$HERE"
build yue2-offline/moto:5 "$HERE/moto.Dockerfile" "$HERE"
build yue2-offline/prometheus:2 "$HERE/prometheus.Dockerfile" "$HERE"
say "stand-ins ready"
