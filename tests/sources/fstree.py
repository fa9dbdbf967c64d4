"""Build small /proc and /sys fixture trees under a tmp folder."""
from __future__ import annotations

import os
from pathlib import Path

# node_exporter's fixtures, copied byte-exact (see PROVENANCE.csv in each folder)
SAMPLES = Path(__file__).resolve().parents[1] / "data"


def write_tree(root: Path, files: dict[str, str | bytes]) -> Path:
    """Write {relative path: content} under `root`; returns `root`."""
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return root


def read_tsv(path: Path) -> dict[str, str]:
    """A flat `path<TAB>value` file (header line first) -> {path: value + newline}."""
    lines = path.read_text().splitlines()
    assert lines[0] == "path\tvalue", lines[0]
    out = {}
    for line in lines[1:]:
        rel, _, value = line.partition("\t")
        out[rel] = value + "\n"
    return out


def read_ttar(path: Path) -> tuple[dict[str, str], list[str]]:
    """Parse a ttar archive -> ({file path: content}, [directory paths])."""
    files: dict[str, str] = {}
    dirs: list[str] = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("Path: "):
            rel = line[6:]
            assert lines[i + 1].startswith("Lines: "), lines[i + 1]
            n = int(lines[i + 1][7:])
            files[rel] = "".join(x + "\n" for x in lines[i + 2:i + 2 + n])
            i += 2 + n
        elif line.startswith("Directory: "):
            dirs.append(line[11:])
            i += 1
        elif line.startswith(("Mode: ", "#")) or not line.strip():
            i += 1
        else:
            raise AssertionError(f"{path}:{i + 1}: unexpected ttar line {line!r}")
    return files, dirs


def materialize_ttar(path: Path, root: Path) -> Path:
    files, dirs = read_ttar(path)
    for d in dirs:
        (root / d).mkdir(parents=True, exist_ok=True)
    return write_tree(root, files)


def read_expected(path: Path) -> dict[tuple[str, frozenset], float]:
    """Prometheus text exposition -> {(metric, frozenset(labels)): value}."""
    out = {}
    for line in path.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        name, _, labels = series.partition("{")
        pairs = []
        for part in labels.rstrip("}").split('",'):
            if part:
                k, _, v = part.partition("=")
                pairs.append((k, v.strip('"')))
        out[(name, frozenset(pairs))] = float(value)
    return out


def values(readings, spec, **attrs) -> dict[tuple, float]:
    """Readings of `spec` whose attributes include `attrs`, keyed by their sorted attributes."""
    out = {}
    for r in readings:
        if r.spec is spec and all(r.attributes.get(k) == v for k, v in attrs.items()):
            out[tuple(sorted(r.attributes.items()))] = r.value
    return out


def one(readings, spec, **attrs) -> float:
    found = values(readings, spec, **attrs)
    assert len(found) == 1, (spec.name, attrs, found)
    return next(iter(found.values()))


def can_deny_reads() -> bool:
    """False when running as root (file modes do not stop root from reading)."""
    return os.geteuid() != 0


def run_as_nobody(fn):
    """Run `fn()` in a forked child that dropped to uid/gid 65534; return its JSON-able result.

    Real permission checks (EACCES on another user's /proc files) without changing the
    machine: only possible when the tests run as root, so callers skip otherwise.
    """
    import json

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns into the test runner
        code = 1
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            os.write(w, json.dumps(fn()).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the unprivileged child failed"
    return json.loads(data)
