"""`otel-gpu trace analyze`'s GPU time by launching code (:mod:`.gpu_flame`): the top stacks in the
terminal and the JSON, ``--folded DIR`` (one folded-stacks file per rank, nanoseconds) and ``--push URL``
(to Pyroscope as the ``gpu_time`` profile type, per rank; :mod:`.gpu_push`)."""
from __future__ import annotations

import argparse
import os
import sys

from ..errors import UsageError
from ..profiling import DEFAULT_SERVICE, service_name   # the ranks' CPU profiles' service_name

TOP_STACKS = 10


def _push_url(text: str) -> str:
    from ..errors import ConfigError
    from ..values import http_url

    if not text.isprintable() or len(text) > 2000:
        raise argparse.ArgumentTypeError(f"expected a URL of printable characters, got {text[:40]!r}")
    try:
        return http_url(text, "--push")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _label(text: str) -> str:
    """A label value: printable, 1 to 200 characters, not only spaces."""
    if not text.strip() or len(text) > 200 or not text.isprintable():
        raise argparse.ArgumentTypeError(f"must be 1 to 200 printable characters, got {text[:40]!r}")
    return text


def add_arguments(a) -> None:
    a.add_argument("--folded", dest="folded_dir", metavar="DIR",
                   help="write each rank's GPU time by launching stack to DIR/gpu_time.rank<N>.folded "
                        "(folded stacks, nanoseconds)")
    a.add_argument("--push", dest="push_url", type=_push_url, metavar="URL",
                   help="push each rank's GPU time by launching stack to the Pyroscope server at URL "
                        "(profile type gpu_time, labels service_name and rank)")
    a.add_argument("--service-name", type=_label, default=None, metavar="NAME",
                   help="with --push: the service_name label (default: OTEL_SERVICE_NAME, else otelgpu.<job> "
                        f"with --job, else {DEFAULT_SERVICE}: as the ranks' CPU profiles)")
    a.add_argument("--job", type=_label, default=None, metavar="NAME", help="with --push: a job label")


def check(args, env=os.environ) -> None:
    """Refuse flag combinations and a --folded folder that cannot be written, before any work."""
    if (args.service_name or args.job) and not args.push_url:
        raise UsageError("--service-name and --job need --push URL")
    if args.folded_dir:
        from .cli import check_folder
        check_folder("--folded", args.folded_dir)
    if args.push_url and not args.service_name:
        args.service_name = service_name(env, args.job)


def folded_files(per_rank: dict) -> list[tuple[str, str]]:
    """(file name, folded text) per rank."""
    from .gpu_flame import folded_text

    return [(f"gpu_time.rank{rank}.folded", folded_text(stacks)) for rank, stacks in sorted(per_rank.items())]


def summary(per_rank: dict, top: int = TOP_STACKS) -> dict:
    """The JSON document's ``gpu_time_by_code``: unit, total per rank, the top stacks of all ranks."""
    from .gpu_flame import UNIT, top_stacks

    return {"unit": UNIT, "total_per_rank": {str(r): sum(s.values()) for r, s in sorted(per_rank.items())},
            "top_stacks": [{"stack": list(s), "gpu_time": ns, "share_pct": pct}
                           for s, ns, pct in top_stacks(per_rank, top)]}


def write_folded(folder: str, per_rank: dict, inputs: list[str]) -> int:
    """Write the folded files into ``folder`` (made if missing) as one; returns how many."""
    from .. import output

    made = None
    if not os.path.isdir(folder):
        os.makedirs(folder)
        made = folder
    files = folded_files(per_rank)
    try:
        output.write_all([(os.path.join(folder, name), text) for name, text in files], inputs)
    except BaseException:
        if made is not None and not os.listdir(made):
            os.rmdir(made)
        raise
    return len(files)


def table(doc_part: dict, top: int = TOP_STACKS) -> tuple[str, list[str], list[list]]:
    """(title, columns, rows) of the top stacks by GPU time, all ranks together, for the terminal: the
    innermost frames of the code that launched the work, the GPU work, ms and % of all GPU time."""
    rows = []
    for r in doc_part["top_stacks"][:top]:
        frames = r["stack"]
        work = len(frames) - (2 if len(frames) > 1 and frames[-2].startswith("[") else 1)
        code = frames[:work]
        code_text = " > ".join(code[-2:]) or "(top level)"
        if len(code) > 2 or len(code_text) > 50:   # the innermost frames matter most: cut on the left
            code_text = "… " + code_text[-48:]
        rows.append([code_text, _short(" ".join(frames[work:]), 60), r["gpu_time"] / 1e6, r["share_pct"]])
    return "GPU time by launching code (top stacks, all ranks; --folded has every stack)", \
        ["launched by", "name", "GPU ms", "%"], rows


def _short(text: str, n: int) -> str:
    """At most ``n`` characters of ``text`` (the terminal cuts further where it is narrower)."""
    return text if len(text) <= n else text[: n - 1] + "…"


def push_all(url: str, per_rank: dict, service_name: str, job: str | None) -> bool:
    """Push every rank's stacks; one line on stderr either way; False when the push failed."""
    from ..words import count
    from .gpu_push import PushError, push, push_body

    ranks = sum(1 for stacks in per_rank.values() if any(ns > 0 for ns in stacks.values()))
    if not ranks:
        print("otel-gpu trace: nothing pushed to Pyroscope: no GPU time in the traces (CPU-only)", file=sys.stderr)
        return True
    try:
        push(url, push_body(per_rank, service_name, job))
    except PushError as exc:
        print(f"otel-gpu trace: cannot push GPU time to Pyroscope: {exc}", file=sys.stderr)
        return False
    print(f"otel-gpu trace: pushed GPU time by launching code ({count(ranks, 'rank')}, service_name "
          f"{service_name}) to {url}", file=sys.stderr)
    return True


def finish(args, per_rank: dict | None, inputs: list[str]) -> int:
    """Write --folded and push --push after the analysis is shown: the exit status (1 when either failed)."""
    ok = True
    if args.folded_dir:
        try:
            n = write_folded(args.folded_dir, per_rank, inputs)
            print(f"otel-gpu trace: wrote {n} folded GPU-time file{'s' if n != 1 else ''} in "
                  f"{os.path.abspath(args.folded_dir)}", file=sys.stderr)
        except OSError as exc:
            print(f"otel-gpu trace: cannot write outputs: {exc.strerror or exc} ({exc.filename or ''})",
                  file=sys.stderr)
            ok = False
    if args.push_url:
        ok = push_all(args.push_url, per_rank, args.service_name, args.job) and ok
    return 0 if ok else 1
