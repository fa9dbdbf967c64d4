#!/bin/sh
# Grafana's entrypoint in the otel-gpu stack: refuse to start without a real admin password.
# The password comes from the secret file (GRAFANA_ADMIN_PASSWORD_FILE on the host), never
# from a default; "admin" and passwords shorter than 12 characters are refused.
set -eu
f="${GF_SECURITY_ADMIN_PASSWORD__FILE:-}"
if [ -z "$f" ] || [ ! -s "$f" ]; then
  echo "otel-gpu: the Grafana admin password file is missing or empty; see docs/deploy.md" >&2
  exit 1
fi
pw=$(cat "$f")
if [ "$pw" = "admin" ] || [ "${#pw}" -lt 12 ]; then
  echo "otel-gpu: refusing the Grafana admin password in $f: use at least 12 characters, not 'admin'" >&2
  exit 1
fi
unset pw
exec /run.sh "$@"
