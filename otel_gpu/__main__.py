"""`python -m otel_gpu ...` is the same as the `otel-gpu` console script."""
import sys

from .cli import main

sys.exit(main(ending=True))
