"""Whose thread a profile sample is: the user's program, otel-gpu's own, or native code (pure).

One definition read by the report's flame graphs (otel_gpu.report.flames) and the diagnosis
(otel_gpu.diagnose.profiles). pyroscope-io labels each sample with `thread_id` (the thread's
pthread id) and `thread_name` (the name Python's `threading` knows it by; otel_gpu.profiling
adds the OS name of threads that run no Python code). A sample with no Python frame is a thread
in native code (C++/CUDA): its time is labelled by thread, since native frames are not sampled.
"""
from __future__ import annotations

import re
from typing import Mapping, Sequence

THREAD_ID = "thread_id"
THREAD_NAME = "thread_name"

# Threads otel-gpu starts are named "otelgpu-..."; the OpenTelemetry SDK's metric reader and batch
# processors name theirs "OtelPeriodicExportingMetricReader" and "OtelBatch<X>RecordProcessor".
OWN_NAME = re.compile(r"^(otelgpu|OtelPeriodicExportingMetricReader$|OtelBatch\w*Processor$)")
# Without a thread name (older recordings, Pyroscope's merged flame graphs): the metric reader's
# loop and its exporter's callback mark its thread.
OWN_FRAME = re.compile(r"(^|\.)(_ticker|_receive_metrics)$")

# Known native threads of PyTorch (c10::setThreadName) and what they run.
NATIVE_GLOSS = (
    (re.compile(r"^pt_autograd_\d+$"), "backward kernels"),
    (re.compile(r"^pt_nccl_watchdo?g"), "NCCL watchdog"),
    (re.compile(r"^pt_nccl_heartbe?a?t"), "NCCL heartbeat monitor"),
    (re.compile(r"^pt_gloo_runloop$"), "gloo I/O loop"),
    (re.compile(r"^pt_tcpstore"), "TCPStore"),
    (re.compile(r"^pt_dist_engine$"), "distributed autograd"),
)
UNNAMED = "(native code, thread unnamed)"


def is_own(stack: Sequence[str], labels: Mapping[str, str]) -> bool:
    """True for a sample of a thread otel-gpu (or the OpenTelemetry SDK it runs) started."""
    name = labels.get(THREAD_NAME, "")
    return bool(name and OWN_NAME.match(name)) or any(OWN_FRAME.search(f) for f in stack)


def native_label(name: str | None) -> str:
    """The flame graph frame for time in a thread with no Python frame, e.g.
    "pt_autograd_0 (native: backward kernels)"; UNNAMED when the thread's name is not known."""
    if not name:
        return UNNAMED
    gloss = next((g for pattern, g in NATIVE_GLOSS if pattern.search(name)), None)
    return f"{name} (native: {gloss})" if gloss else f"{name} (native code)"


def thread_names(samples) -> dict[tuple, str]:
    """(process key, thread id) -> thread name, from every sample that carries both labels, so a
    thread's samples pushed before its name was known get it too. `samples`: (process key, labels)."""
    out: dict[tuple, str] = {}
    for proc, labels in samples:
        tid, name = labels.get(THREAD_ID), labels.get(THREAD_NAME)
        if tid and name:
            out[(proc, tid)] = name
    return out
