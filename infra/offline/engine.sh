#!/usr/bin/env bash
# Makes sure a Docker engine answers, for `make test-compose` on a machine like the ones this was
# built on (Debian bookworm, root, no engine running): installs Debian's docker.io, docker-compose
# (v1.29: profiles and `service_completed_successfully`) and debootstrap when they are missing, and
# starts dockerd with infra/offline/daemon.json, which keeps every container address inside
# 198.51.100.0/24 (`bip`, `default-address-pools`) and gives the embedded DNS no upstream.
# An engine that already answers is used as it is (its own daemon.json is the operator's).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
LOG=${YUE2_DOCKERD_LOG:-/var/log/yue2-dockerd.log}

if docker info >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "engine.sh: no Docker engine answers and this is not root: start dockerd with $HERE/daemon.json" >&2
  exit 1
fi
missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v docker-compose >/dev/null || docker compose version >/dev/null 2>&1 || missing+=(docker-compose)
command -v debootstrap >/dev/null || missing+=(debootstrap)
if [ ${#missing[@]} -gt 0 ]; then
  echo "engine.sh: installing ${missing[*]} (Debian)" >&2
  apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q "${missing[@]}" >/dev/null; }
fi
echo "engine.sh: starting dockerd --config-file $HERE/daemon.json (log: $LOG)" >&2
setsid dockerd --config-file "$HERE/daemon.json" >>"$LOG" 2>&1 < /dev/null &
# Wait on the engine's answer, not a fixed time; a dockerd that exits ends the wait at once.
pid=$!
for _ in $(seq 1 600); do
  docker info >/dev/null 2>&1 && exit 0
  kill -0 "$pid" 2>/dev/null || { echo "engine.sh: dockerd exited; its log:" >&2; tail -20 "$LOG" >&2; exit 1; }
  sleep 0.1
done
echo "engine.sh: dockerd did not answer within 60 s; its log:" >&2
tail -20 "$LOG" >&2
exit 1
