#!/bin/sh
# As the official redis image: a bare `redis-server` gets --protected-mode no, and runs as `redis`.
set -eu
if [ "$1" = redis-server ]; then
  case " $* " in *" --protected-mode "*) ;; *) set -- "$@" --protected-mode no ;; esac
  exec setpriv --reuid=redis --regid=redis --init-groups "$@"
fi
exec "$@"
