#!/bin/sh
# Creates the Grafana admin password for the compose stack (and .env from .env.example):
#
#   ./init-secrets.sh && docker compose up -d
#
# Who may read the password: compose bind-mounts a file secret into the container with its
# host owner and mode (it cannot change them for file secrets), and the Grafana image reads it
# as uid 472. So the file is 0644 while its folder `secrets/` stays 0700: on this host only you
# (and root, the Docker daemon) can reach it; inside the stack only the Grafana container
# mounts it. A file made with `umask 077` alone is 0600 and Grafana's start script refuses it.
# Idempotent: an existing password is kept; the modes are set again on every run.
set -eu
cd "$(dirname "$0")"
umask 077
mkdir -p secrets
chmod 0700 secrets
f=secrets/grafana_admin_password
if [ ! -s "$f" ]; then
  head -c 24 /dev/urandom | base64 > "$f.new"     # 32 characters
  mv "$f.new" "$f"
  echo "otel-gpu: wrote a new Grafana admin password to compose/$f"
fi
chmod 0644 "$f"
if [ ! -e .env ]; then
  cp .env.example .env
  echo "otel-gpu: wrote compose/.env from .env.example"
fi
echo "otel-gpu: compose/secrets is 0700, compose/$f is 0644 (readable by Grafana's uid 472)"
