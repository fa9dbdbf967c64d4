#!/usr/bin/env bash
# Every check that needs a real GPU, in two calls; figures go to $OUT or ./gpu-check-out. Run on a GPU
# machine from the checkout's root, with the project and its test dependencies importable there (or
# name a script that sets them up in GPU_CHECK_SETUP: it is sourced first):
#   bash bench/gpu_node_check.sh agent   # doctor, NVML tests, agent vs node_exporter, the agent's RSS (~5 min)
#   bash bench/gpu_node_check.sh rest    # the trace, tuner, diagnosis and NCCL gpu tests (<= 8 min)
# Each step has its own time limit, so one slow step leaves the others' figures.
set -u
what=${1:-agent}
case $what in agent|rest) ;; *) echo "usage: bash bench/gpu_node_check.sh agent|rest"; exit 2 ;; esac
out=${OUT:-gpu-check-out}; mkdir -p "$out"
if [ -n "${GPU_CHECK_SETUP:-}" ]; then
  source "$GPU_CHECK_SETUP" || { echo "set-up $GPU_CHECK_SETUP failed"; exit 1; }
fi
step() {  # step NAME LIMIT_S COMMAND...: run it, keep its output in $out/NAME.txt, print its tail
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout -k 10 "$limit" "$@" > "$out/$name.txt" 2>&1; local rc=$?
  echo "== $name: rc=$rc, $((SECONDS - t0)) s"; tail -n 40 "$out/$name.txt"
}
case $what in
agent)
  step nvidia-smi 30 nvidia-smi
  step doctor 60 python3 -m otel_gpu doctor
  step pytest-nvml 150 python3 -m pytest -q -rs -m gpu -p no:cacheprovider tests/gpu/test_nvml_fake.py \
       tests/gpu/test_nvml_golden.py tests/gpu/test_nvml_shared.py tests/gpu/test_nvml_cadence.py tests/gpu/test_units.py
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  python3 -m otel_gpu agent --no-live --interval 0.1 --prometheus-port "$port" > "$out/agent-rss.log" 2>&1 &
  agent=$!
  sleep 25; python3 -c "import httpx; httpx.get('http://127.0.0.1:$port/metrics', timeout=5)"
  step agent-rss 20 python3 bench/rss_breakdown.py "$agent" --top 20
  kill "$agent"; wait "$agent" 2>/dev/null
  step bench-agent 260 python3 bench/bench_agent.py --real-gpus --intervals 1,0.1 --duration 60
  ;;
rest)
  step pytest-rest 460 python3 -m pytest -q -rs -m gpu -p no:cacheprovider tests/trace/test_findings_gpu.py \
       tests/tune/test_e2e_evidence.py tests/diagnose/test_agent_gpu.py tests/gpu/test_collective_nccl.py
  ;;
esac
