#!/usr/bin/env bash
# Install what the test suite needs on a Debian bookworm machine (run as root).
# Idempotent: every step is skipped when its result is already there.
set -euo pipefail

cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
CACHE="${OTELGPU_CACHE:-$HOME/.cache/otel-gpu}"
VM_ROOT="$CACHE/victoria-metrics"
PY="${PYTHON:-$(command -v python3 || command -v python)}"

step() { printf '[install] %s\n' "$*"; }
now() { date +%s; }

# 1. Debian packages: Prometheus, node_exporter, docker-compose (config validation only), Chromium
#    (headless, to open the recorded-run report in tests/record/test_report_browser.py), Alertmanager
#    (tests/alerts: the shipped rules' alerts delivered to a webhook), PostgreSQL (tests/tune/test_postgres.py:
#    several tuners on one study; the test starts its own throwaway cluster on loopback).
t0=$(now)
missing=()
for pair in prometheus:prometheus prometheus-node-exporter:prometheus-node-exporter docker-compose:docker-compose \
            chromium:chromium prometheus-alertmanager:prometheus-alertmanager; do
  cmd=${pair%%:*}; pkg=${pair##*:}
  command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
done
"$PY" -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)   # Debian's python3 ships without pip
# tests/test_quickstart.py makes a fresh virtual environment (Debian's python3 needs python3-venv for it)
"$PY" -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)
compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null || missing+=(postgresql)   # its binaries are off PATH
if ((${#missing[@]})); then
  step "apt: installing ${missing[*]}"
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
  step "apt: done in $(($(now) - t0)) s"
else
  step "apt: prometheus, prometheus-node-exporter, docker-compose, chromium, prometheus-alertmanager, postgresql already installed"
fi

# 2. From Debian sid, with a private apt state so the machine's sources stay untouched:
#    VictoriaMetrics (bookworm's 1.79 lacks the OTLP receiver we test against) and
#    Prometheus 3 + promtool 3 (to check the compose stack's Prometheus config, whose otlp: section 2.42 rejects).
sid_fetch() {  # sid_fetch DEST PACKAGE...: extract the packages' files under DEST (skipped when DEST exists)
  local dest=$1; shift
  local t0 d m deb
  t0=$(now)
  if [[ -f "$dest/VERSION" ]]; then
    step "$*: $(cat "$dest/VERSION") already in $dest"
    return
  fi
  step "$*: downloading from Debian sid into $dest"
  d=$(mktemp -d)
  mkdir -p "$d/lists/partial" "$d/archives/partial"
  m=$(sed -n "s/^URIs: *\(.*\/debian\)$/\1/p" /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
  [[ -n "$m" ]] || m=$(sed -n "s/^deb \(\[[^]]*\] \)\?\(\S*\/debian\) .*/\2/p" /etc/apt/sources.list 2>/dev/null | head -1)
  m=${m:-http://deb.debian.org/debian}
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $m sid main" > "$d/sources.list"
  local O=(-o "Dir::Etc::SourceList=$d/sources.list" -o Dir::Etc::SourceParts=/dev/null
     -o "Dir::State::Lists=$d/lists" -o "Dir::Cache::Archives=$d/archives"
     -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache=
     -o APT::Sandbox::User=root)   # a private root-owned temp dir: no _apt sandbox
  apt-get "${O[@]}" -q update >/dev/null
  (cd "$d" && apt-get "${O[@]}" -q download "$@" >/dev/null)
  rm -rf "$dest.tmp"
  mkdir -p "$dest.tmp"
  for deb in "$d"/*.deb; do dpkg-deb -x "$deb" "$dest.tmp"; done
  dpkg-deb -f "$(ls "$d"/"$1"_*.deb)" Version > "$dest.tmp/VERSION"
  rm -rf "$dest" "$d"
  mv "$dest.tmp" "$dest"
  step "$*: $(cat "$dest/VERSION") installed in $(($(now) - t0)) s"
}
sid_fetch "$VM_ROOT" victoria-metrics
sid_fetch "$CACHE/prometheus3" prometheus promtool

# 3. The project itself, editable, with every extra the tests import.
t0=$(now)
pip_args=(-q --root-user-action=ignore)
# a distribution's own Python refuses pip installs (PEP 668); this machine is CI's, so install anyway
if "$PY" -c 'import sys, sysconfig, os; sys.exit(not os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")))'; then
  pip_args+=(--break-system-packages)
fi
# torch first and pinned: the CPU wheel of this machine kind; anything else would pull GBs of CUDA
step "pip: installing torch==2.13.0 (CPU) into $PY"
"$PY" -m pip install "${pip_args[@]}" torch==2.13.0
step "pip: installing -e .[test,profile,dashboards,tune,postgres,train,trace,instrument] into $PY"
"$PY" -m pip install "${pip_args[@]}" -e '.[test,profile,dashboards,tune,postgres,train,trace,instrument]'
"$PY" -c 'import torch, sys; v = torch.__version__; sys.exit(0 if v.startswith("2.13.0") else f"torch {v} installed, expected 2.13.0")'
step "pip: done in $(($(now) - t0)) s"

# 4. DeepSpeed compiles its CPU communication op on first use (~90 s, cached in ~/.cache/torch_extensions):
#    pay it here, once per machine, rather than inside a timed test.
t0=$(now)
DS_ACCELERATOR=cpu RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29531 \
  "$PY" -c "import deepspeed; deepspeed.init_distributed(dist_backend='gloo')" >/dev/null 2>&1 \
  || step "deepspeed: warm-up failed (the first DeepSpeed test will compile the op)"
step "deepspeed: CPU op ready in $(($(now) - t0)) s"
