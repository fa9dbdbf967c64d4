"""A /sys view for end-to-end agent runs: the real InfiniBand fixture tree plus this machine's net and block."""
from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data"


def sys_with_infiniband(root: Path) -> Path:
    """`root/sys` holding class/infiniband from node_exporter's fixture, and links to the real /sys for the rest."""
    sys_root = root / "sys"
    lines = (DATA / "infiniband" / "node_exporter_sys_class_infiniband_flat.tsv").read_text().splitlines()[1:]
    for line in lines:
        rel, _, value = line.partition("\t")
        path = root / rel   # rel starts with "sys/"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(value + "\n")
    for name in ("net", "block"):
        (sys_root / "class" / name).symlink_to(Path("/sys/class") / name)
    (sys_root / "block").symlink_to("/sys/block")
    return sys_root
