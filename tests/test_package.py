import subprocess
import sys

import otel_gpu
from otel_gpu import training


def test_training_api_at_the_top_level_is_the_training_module_api():
    assert otel_gpu.step is training.step and otel_gpu.phase is training.phase
    assert otel_gpu.checkpoint is training.checkpoint


def test_importing_the_package_loads_no_opentelemetry():
    code = "import sys, otel_gpu; print(any(m.startswith('opentelemetry') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_every_subcommand_is_registered():
    out = subprocess.run([sys.executable, "-m", "otel_gpu", "--help"], capture_output=True, text=True, check=True)
    for command in ("agent", "doctor", "run", "trace", "dashboards", "alerts", "diagnose", "tune"):
        assert command in out.stdout, command


def test_usage_errors_name_the_subcommand_even_when_it_has_a_command_option():
    out = subprocess.run([sys.executable, "-m", "otel_gpu", "tune", "--base-config", "/nonexistent.json",
                          "--command", "train {config}", "--trials", "1"], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.startswith("otel-gpu tune: --base-config /nonexistent.json"), out.stderr
