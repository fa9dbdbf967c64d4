"""`python -m otel_gpu.trace analyze|diff ...`: the trace commands without the other subcommands."""
import argparse
import sys

from ..errors import UsageError
from ..exiting import end_of_process
from ..safe_text import visible
from . import cli


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m otel_gpu.trace")
    sub = parser.add_subparsers(dest="command", required=True)
    cli.register(sub)
    args = parser.parse_args(["trace", *(sys.argv[1:] if argv is None else argv)])
    try:
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(f"otel-gpu trace: {visible(str(exc))}", file=sys.stderr)   # it can name a file of the trace set
        return 2


if __name__ == "__main__":
    status = main()
    end_of_process()
    sys.exit(status)
