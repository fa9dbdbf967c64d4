#!/bin/sh
# Grafana's entrypoint in the otel-gpu stack: refuse to start without a real admin password.
# The password comes from the secret file (GRAFANA_ADMIN_PASSWORD_FILE on the host), never
# from a default; "admin" and passwords shorter than 12 characters are refused. It also
# refuses a file this container's user (uid 472) cannot read: Grafana's own run.sh would then
# start with an empty variable, that is with Grafana's default password.
set -eu
f="${GF_SECURITY_ADMIN_PASSWORD__FILE:-}"
if [ -z "$f" ] || [ ! -s "$f" ]; then
  echo "otel-gpu: the Grafana admin password file is missing or empty; see docs/deploy.md" >&2
  exit 1
fi
if [ ! -r "$f" ]; then
  echo "otel-gpu: uid $(id -u) cannot read the Grafana admin password file $f: make the host file mode 0644 in a 0700 folder (compose/init-secrets.sh does); see docs/deploy.md" >&2
  exit 1
fi
pw=$(cat "$f")
if [ "$pw" = "admin" ] || [ "${#pw}" -lt 12 ]; then
  echo "otel-gpu: refusing the Grafana admin password in $f: use at least 12 characters, not 'admin'" >&2
  exit 1
fi
unset pw
exec /run.sh "$@"
