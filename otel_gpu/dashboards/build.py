"""Generate dashboard JSON from `*.dashboard.py` definitions, and check committed JSON against them.

A definition is a Python file that builds a grafanalib `Dashboard` and binds it to the
module-level name `dashboard` (the grafanalib convention). `cluster-overview.dashboard.py`
generates `cluster-overview.json`. The JSON is rendered deterministically (sorted keys,
two-space indent, trailing newline) so a diff means a real change.
"""
from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from .. import output

SUFFIX = ".dashboard.py"


class DefinitionError(Exception):
    """A definition that does not load or does not define `dashboard` (one line, the file named)."""


@dataclass(frozen=True)
class Generated:
    source: Path       # the .dashboard.py file
    name: str          # "cluster-overview"
    text: str          # the rendered JSON

    @property
    def json_name(self) -> str:
        return self.name + ".json"


def default_dir() -> Path:
    """`grafana/dashboards/` of the source tree this package was loaded from."""
    return Path(__file__).resolve().parents[2] / "grafana" / "dashboards"


def definitions(src: Path) -> list[Path]:
    return sorted(p for p in Path(src).glob("*" + SUFFIX) if p.is_file())


def _encode(obj):
    to_json = getattr(obj, "to_json_data", None)
    if to_json is None:
        raise TypeError(f"cannot render {type(obj).__name__} as dashboard JSON")
    return to_json()


def render(dashboard) -> str:
    """A grafanalib Dashboard (or plain dict) -> its JSON text."""
    return json.dumps(dashboard, default=_encode, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def load(path: Path):
    """Execute one definition and return its `dashboard` object."""
    name = "otelgpu_dashboard_" + path.name[: -len(SUFFIX)].replace("-", "_")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise DefinitionError(f"{path}: not loadable as Python")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # a broken definition is reported as one line naming the file
        raise DefinitionError(f"{path}: {type(exc).__name__}: {exc}") from exc
    dash = getattr(module, "dashboard", None)
    if dash is None:
        raise DefinitionError(f"{path}: defines no variable 'dashboard'")
    return dash


def generate(src: Path) -> list[Generated]:
    """Render every definition in `src` (all of them, or DefinitionError for the first that fails)."""
    out = []
    for path in definitions(src):
        text = render(load(path))
        out.append(Generated(path, path.name[: -len(SUFFIX)], text))
    return out


def write(generated: list[Generated], out: Path) -> list[Path]:
    """Write each JSON file whole (`otel_gpu.output`: temp file + rename): never a half-written dashboard."""
    out.mkdir(parents=True, exist_ok=True)
    return [output.write(out / gen.json_name, gen.text) for gen in generated]


def differences(generated: list[Generated], out: Path) -> list[str]:
    """One line per JSON file in `out` that is missing or differs from what the code generates."""
    problems = []
    for gen in generated:
        target = out / gen.json_name
        if not target.exists():
            problems.append(f"{target}: missing (generated from {gen.source.name})")
        elif target.read_text(encoding="utf-8") != gen.text:
            problems.append(f"{target}: differs from {gen.source.name}")
    return problems
