#!/usr/bin/env bash
# Install what the test suite needs on a Debian bookworm machine (run as root).
# Idempotent: every step is skipped when its result is already there.
set -euo pipefail

cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
CACHE="${OTELGPU_CACHE:-$HOME/.cache/otel-gpu}"
VM_ROOT="$CACHE/victoria-metrics"
VM_BIN="$VM_ROOT/usr/bin/victoria-metrics"
PY="${PYTHON:-$(command -v python3 || command -v python)}"

step() { printf '[install] %s\n' "$*"; }
now() { date +%s; }

# 1. Debian packages: Prometheus, node_exporter, docker-compose (config validation only).
t0=$(now)
missing=()
for pair in prometheus:prometheus prometheus-node-exporter:prometheus-node-exporter docker-compose:docker-compose; do
  cmd=${pair%%:*}; pkg=${pair##*:}
  command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
done
"$PY" -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)   # Debian's python3 ships without pip
if ((${#missing[@]})); then
  step "apt: installing ${missing[*]}"
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
  step "apt: done in $(($(now) - t0)) s"
else
  step "apt: prometheus, prometheus-node-exporter, docker-compose already installed"
fi

# 2. VictoriaMetrics from Debian sid (bookworm's 1.79 lacks the OTLP receiver we test against),
#    fetched with a private apt state so the machine's sources stay untouched.
t0=$(now)
if [[ -x "$VM_BIN" ]]; then
  step "victoria-metrics: $(cat "$VM_ROOT/VERSION" 2>/dev/null) already at $VM_BIN"
else
  step "victoria-metrics: downloading from Debian sid into $VM_ROOT"
  d=$(mktemp -d)
  trap 'rm -rf "$d"' EXIT
  mkdir -p "$d/lists/partial" "$d/archives/partial"
  m=$(sed -n "s/^URIs: *\(.*\/debian\)$/\1/p" /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
  [[ -n "$m" ]] || m=$(sed -n "s/^deb \(\[[^]]*\] \)\?\(\S*\/debian\) .*/\2/p" /etc/apt/sources.list 2>/dev/null | head -1)
  m=${m:-http://deb.debian.org/debian}
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $m sid main" > "$d/sources.list"
  O=(-o "Dir::Etc::SourceList=$d/sources.list" -o Dir::Etc::SourceParts=/dev/null
     -o "Dir::State::Lists=$d/lists" -o "Dir::Cache::Archives=$d/archives"
     -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache=
     -o APT::Sandbox::User=root)   # a private root-owned temp dir: no _apt sandbox
  apt-get "${O[@]}" -q update >/dev/null
  (cd "$d" && apt-get "${O[@]}" -q download victoria-metrics >/dev/null)
  rm -rf "$VM_ROOT.tmp"
  mkdir -p "$VM_ROOT.tmp"
  deb=$(ls "$d"/victoria-metrics_*.deb)
  dpkg-deb -x "$deb" "$VM_ROOT.tmp"
  dpkg-deb -f "$deb" Version > "$VM_ROOT.tmp/VERSION"
  rm -rf "$VM_ROOT"
  mv "$VM_ROOT.tmp" "$VM_ROOT"
  step "victoria-metrics: $(cat "$VM_ROOT/VERSION") installed in $(($(now) - t0)) s"
fi

# 3. The project itself, editable, with every extra the tests import.
t0=$(now)
pip_args=(-q --root-user-action=ignore)
# a distribution's own Python refuses pip installs (PEP 668); this machine is CI's, so install anyway
if "$PY" -c 'import sys, sysconfig, os; sys.exit(not os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")))'; then
  pip_args+=(--break-system-packages)
fi
step "pip: installing -e .[test,profile,dashboards,tune] into $PY"
"$PY" -m pip install "${pip_args[@]}" -e '.[test,profile,dashboards,tune]'
step "pip: done in $(($(now) - t0)) s"
