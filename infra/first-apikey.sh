#!/bin/sh
# The compose stack's one-shot `apikey` service: a first API key for tenant $YUE2_FIRST_TENANT, saved
# in the `apikey` volume (/keys/api-key) and printed. Run again (every `up`), it prints the saved key
# while that key is still active in the database, and makes a new one otherwise (a fresh database,
# a revoked key): one key per stack, not one per `up`.
#   docker compose logs apikey      # or: docker compose run --rm apikey
set -eu
tenant="${YUE2_FIRST_TENANT:-default}"
file=/keys/api-key
if [ -s "$file" ]; then
  prefix="$(cut -c1-10 "$file")"
  # `yue2 apikey list` prints JSON lines: id, tenant, prefix ("<10 chars>..."), name, state, ...
  if ! yue2 apikey list --tenant "$tenant" | grep -q "\"prefix\": \"$prefix\.\.\.\".*\"state\": \"active\""; then
    echo "the saved key is not active in this database: creating a new one" >&2
    rm -f "$file"
  fi
fi
if [ ! -s "$file" ]; then
  umask 077
  yue2 apikey create --tenant "$tenant" --name compose-first-key > "$file.tmp"
  mv "$file.tmp" "$file"
fi
echo "YUE2_API_KEY=$(cat "$file")  (tenant $tenant)"
