"""diagnose --json F --markdown F: two outputs naming one file are refused before any work (the
JSON was silently replaced by the Markdown), also through another spelling or a link."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.childenv import clean_env

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("second", ["out.txt", "./out.txt", "link.txt"])
def test_two_outputs_to_one_file_are_refused(tmp_path, second):
    (tmp_path / "link.txt").symlink_to(tmp_path / "out.txt")
    proc = subprocess.run([sys.executable, "-m", "otel_gpu", "diagnose", str(tmp_path / "no-run"), "--json", "out.txt",
                           "--markdown", second], env={**clean_env(), "PYTHONPATH": str(REPO)}, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--json and --markdown name the same file" in proc.stderr and proc.stderr.strip().count("\n") == 0
    assert not (tmp_path / "out.txt").exists()
