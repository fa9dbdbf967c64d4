#!/usr/bin/env bash
# Every check that needs a real GPU, in one call of at most ~5 minutes; run on a GPU machine from the
# checkout's root with the project and its test dependencies importable (or name a script that sets them up
# in GPU_CHECK_SETUP: it is sourced first):
#   bash bench/gpu_node_check.sh all     # everything below, in four lanes that overlap
#   bash bench/gpu_node_check.sh tests|agent|tune|job    # one lane alone (a rerun of what failed)
# Lanes: tests = the `gpu`-marked tests (the NCCL ones first, on a quiet GPU, then the others); agent = doctor,
# the agent's CPU beside node_exporter at 1 s and 0.1 s (bench_agent.py --real-gpus) and its RSS by mapping;
# tune = the tuner's CUDA `gpu` test; job = a GPT-2-small job under `otel-gpu run` and its report. In `all`,
# the GPU-heavy steps run one after the other (NCCL tests, job, tuner: no job's GPU counters hold another's
# kernels) while the agent's figures (the job on the GPU beside them: a training node) and the other tests
# are taken. Each step runs under its own limit, cut to what is left of GPU_CHECK_DEADLINE_S (290 s); a budget
# line per step goes to $out/budget.txt. Output, in $OUT or ./gpu-check-out: check figures and logs packed
# in steps.tgz (refreshed after every step), budget.txt, report.html and recording.sqlite of the job.
# Without a GPU, the steps that need one say so in one line and take no time. GPU_CHECK_JOB_ARGS replaces
# the job's arguments (a small model for trying the lane on CPU).
set -u
what=${1:-all}
case $what in all|tests|agent|tune|job) ;; *) echo "usage: bash bench/gpu_node_check.sh all|tests|agent|tune|job" >&2; exit 2 ;; esac
out=${OUT:-gpu-check-out}; mkdir -p "$out" || exit 1
out=$(cd "$out" && pwd)
work=$(mktemp -d /tmp/gpu-check.XXXXXX) || exit 1
if [ -n "${GPU_CHECK_SETUP:-}" ]; then
  source "$GPU_CHECK_SETUP" || { echo "set-up $GPU_CHECK_SETUP failed" >&2; exit 1; }
fi
t_start=$(date +%s); deadline=${GPU_CHECK_DEADLINE_S:-290}
: > "$out/budget.txt"
have_gpu=0; nvidia-smi -L > "$work/gpus.txt" 2>&1 && grep -q '^GPU ' "$work/gpus.txt" && have_gpu=1
PYTEST=(python3 -m pytest -q -rA -p no:cacheprovider -o junit_logging=system-out)

pack() {  # the work folder into $out/steps.tgz, replaced in one rename (lanes pack concurrently)
  local tmp="$out/steps-$BASHPID.tgz.part"
  tar czf "$tmp" -C "$work" . 2>/dev/null && mv -f "$tmp" "$out/steps.tgz"
}
budget() { echo "budget $1" | tee -a "$out/budget.txt"; }
cap() {  # cap LIMIT_S: the limit, or what is left of the deadline where that is less
  local left=$(( deadline - ($(date +%s) - t_start) ))
  echo $(( left < $1 ? left : $1 ))
}
step() {  # step NAME LIMIT_S COMMAND...: output in $work/NAME.txt; the limit cut to the deadline
  local name=$1 limit; limit=$(cap "$2"); shift 2
  local left=$(( deadline - ($(date +%s) - t_start) ))
  if [ "$limit" -lt 5 ]; then budget "$name: not run: ${left} s left of the ${deadline} s deadline"; return 124; fi
  local t0; t0=$(date +%s)
  timeout -k 5 "$limit" "$@" > "$work/$name.txt" 2>&1; local rc=$?
  budget "$name: rc=$rc, $(( $(date +%s) - t0 )) s of limit ${limit} s (at +$(( $(date +%s) - t_start )) s)"
  pack; return $rc
}
need_gpu() {  # need_gpu NAME: 0 where a GPU is here, else one budget line
  [ "$have_gpu" = 1 ] && return 0
  budget "$1: not run: no GPU here (nvidia-smi -L: $(head -c 120 "$work/gpus.txt" | tr '\n' ' '))"; return 1
}

machine() {
  step machine 30 bash -c 'nvidia-smi --query-gpu=name,driver_version,memory.total,mig.mode.current --format=csv;
    python3 -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda,
      torch.cuda.nccl.version() if torch.cuda.is_available() else \"no CUDA\")"; nproc; uname -r'
}

tests_nccl() {  # first, while nothing else runs on the GPU: the Flight Recorder's times against the profiler's
  step tests-nccl 100 "${PYTEST[@]}" -m gpu --timeout 90 --junitxml "$work/junit-nccl.xml" \
       tests/gpu/test_collective_nccl.py tests/gpu/test_stall_nccl.py
}

tests_gpu() {  # every other gpu test but the tuner's (light GPU work: NVML reads, a few profiled steps)
  step tests-gpu 140 "${PYTEST[@]}" -m gpu --timeout 90 --junitxml "$work/junit-gpu.xml" \
       --continue-on-collection-errors --ignore tests/gpu/test_collective_nccl.py \
       --ignore tests/gpu/test_stall_nccl.py --deselect tests/tune/test_e2e_evidence.py::test_cuda_trials_carry_gpu_evidence tests/
}

lane_agent() {
  step doctor 30 python3 -m otel_gpu doctor
  local port
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  python3 -m otel_gpu agent --no-live --interval 0.1 --prometheus-port "$port" > "$work/agent-rss.log" 2>&1 &
  local agent=$!
  need_gpu bench-agent-1s && step bench-agent-1s 120 python3 bench/bench_agent.py --real-gpus --intervals 1 \
       --duration 40 --repeat 2 &
  local b1=$!
  need_gpu bench-agent-0.1s && step bench-agent-0.1s 80 python3 bench/bench_agent.py --real-gpus --intervals 0.1 \
       --duration 20 --repeat 2 &
  local b2=$!
  local nap; nap=$(cap 30); [ "$nap" -gt 0 ] && sleep "$nap"   # the RSS agent: 300 rounds at 0.1 s, then a scrape
  python3 -c "import httpx; httpx.get('http://127.0.0.1:$port/metrics', timeout=5)" >> "$work/agent-rss.log" 2>&1
  step agent-rss 20 python3 bench/rss_breakdown.py "$agent" --top 20
  kill "$agent" 2>/dev/null; wait "$agent" 2>/dev/null
  wait "$b1" "$b2"
}

lane_tune() {
  need_gpu tests-tune || return 0
  local limit; limit=$(cap 180)   # pytest's own timeout first, so that the failure is in its report
  step tests-tune "$limit" "${PYTEST[@]}" -m gpu --timeout $(( limit > 20 ? limit - 10 : 10 )) \
       --junitxml "$work/junit-tune.xml" \
       tests/tune/test_e2e_evidence.py::test_cuda_trials_carry_gpu_evidence
}

lane_job() {  # GPT-2 small (124M, bf16) for 40 s under otel-gpu run; its report and recording to $out
  need_gpu job || return 0
  step job 120 python3 -m otel_gpu run --job gpt2-check --record "$work/run" -- \
       python3 examples/gpt2_train.py ${GPU_CHECK_JOB_ARGS:---seconds 40}
  [ -f "$work/run/report.html" ] && cp "$work/run/report.html" "$out/report.html"
  [ -f "$work/run/recording.sqlite" ] && [ "$(stat -c %s "$work/run/recording.sqlite")" -lt 15000000 ] \
    && cp "$work/run/recording.sqlite" "$out/recording.sqlite"
  [ -d "$work/run" ] && step job-diagnose 30 python3 -m otel_gpu diagnose "$work/run" \
       --markdown "$work/job-diagnosis.md" --json "$work/job-diagnosis.json"
  rm -f "$work/run/recording.sqlite"; pack
}

summary() {  # the figures, last, so that the end of the output holds them
  echo; echo "== budget"; cat "$out/budget.txt"
  echo "== total: $(( $(date +%s) - t_start )) s; logs in $work, packed in $out/steps.tgz"
  [ -f "$work/machine.txt" ] && { echo "== machine"; cat "$work/machine.txt"; }
  echo "== gpu tests"
  python3 - "$work" <<'EOF'
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
for f in sorted(Path(sys.argv[1]).glob("junit-*.xml")):
    for case in ET.parse(f).getroot().iter("testcase"):
        kind = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
        why = next((c.get("message", "") for c in case if c.tag in ("failure", "error", "skipped")), "")
        print(f"{kind.upper():8} {float(case.get('time', 0)):6.1f} s  {case.get('classname')}::{case.get('name')}"
              + (f"  -- {why[:300]}" if why else ""))
EOF
  for f in "$work"/bench-agent-*.txt "$work"/agent-rss.txt; do [ -f "$f" ] && { echo "== $(basename "$f")"; tail -n 30 "$f"; }; done
  [ -f "$work/tests-nccl.txt" ] && { echo "== NCCL job output"; grep -E '^\{"(time|after_steps)' "$work/tests-nccl.txt" | cut -c1-1500; }
  [ -f "$work/job.txt" ] && { echo "== job"; grep -v 'loss_type' "$work/job.txt" | tail -n 25; }
}

case $what in
all)   # the GPU-heavy steps one after the other (NCCL, job, tune: ~4 min), the light ones beside them
  machine
  { tests_nccl; lane_job; lane_tune; } & heavy=$!
  lane_agent
  tests_gpu
  wait "$heavy" ;;
tests) machine; tests_nccl; tests_gpu ;;
agent) machine; lane_agent ;;
tune) machine; lane_tune ;;
job) machine; lane_job ;;
esac
pack
summary
