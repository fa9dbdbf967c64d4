"""The environment for a child process a test starts: no launcher or OTel variables leak in."""
from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LEAKY = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "OTEL_", "OTELGPU_", "SLURM_", "TORCHELASTIC_", "MASTER_")


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without launcher/OTel variables, the repo on PYTHONPATH, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(LEAKY)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    env.update(extra)
    return env
