"""Where a running process's resident memory is: peak and current RSS, then the mappings holding
most of it (anonymous memory, the heap, each shared library), from /proc/PID/smaps.

    python bench/rss_breakdown.py PID [--top 15]

Used on a GPU node to see what real NVML adds to the node agent's memory beside fake GPUs.
"""
from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path


def mapping_rss_kb(smaps_text: str) -> collections.Counter:
    """{mapping (file path, or [anon] / [heap] / [stack]): resident KB} of one smaps text (pure)."""
    totals: collections.Counter = collections.Counter()
    current = "[anon]"
    for line in smaps_text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if "-" in parts[0] and not parts[0].endswith(":"):    # a mapping's header: range perms offset dev inode [path]
            current = parts[5] if len(parts) > 5 else "[anon]"
        elif parts[0] == "Rss:":
            totals[current] += int(parts[1])
    return totals


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pid", type=int)
    p.add_argument("--top", type=int, default=15, help="mappings shown")
    args = p.parse_args()
    try:
        status = Path(f"/proc/{args.pid}/status").read_text()
        smaps = Path(f"/proc/{args.pid}/smaps").read_text()
    except OSError as err:
        print(f"rss_breakdown: cannot read process {args.pid}: {err.strerror}", file=sys.stderr)
        return 1
    for line in status.splitlines():
        if line.startswith(("VmHWM", "VmRSS", "RssAnon", "RssFile", "Threads")):
            print(line)
    totals = mapping_rss_kb(smaps)
    for path, kb in totals.most_common(args.top):
        print(f"{kb / 1024:8.2f} MB  {path}")
    print(f"{sum(totals.values()) / 1024:8.2f} MB  in all ({len(totals)} mappings)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
