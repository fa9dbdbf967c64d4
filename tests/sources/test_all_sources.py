"""What every source here promises the agent: the protocol, known names, sane attributes."""
import json
import math
import os

import pytest

from otel_gpu import names
from otel_gpu.readings import Source
from otel_gpu.sources.disk import DiskSource
from otel_gpu.sources.host import HostSource
from otel_gpu.sources.infiniband import InfinibandSource
from otel_gpu.sources.net import NetSource
from otel_gpu.sources.process import ProcessSource
from fstree import SAMPLES, materialize_ttar


def sources(tmp_path):
    materialize_ttar(SAMPLES / "infiniband" / "node_exporter_sys_class_infiniband.ttar", tmp_path)
    return [
        NetSource(exclude=()),
        InfinibandSource(str(tmp_path / "sys")),
        DiskSource(paths=[str(tmp_path)]),
        HostSource(),
        ProcessSource(lambda: [os.getpid(), 1]),
    ]


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")
def test_contract(tmp_path):
    known = {s.name: s for s in names.all_specs()}
    for src in sources(tmp_path):
        assert isinstance(src, Source), src
        assert src.name in {"net", "infiniband", "disk", "host", "process"}
        readings = src.read() + src.read()
        assert readings, src.name
        for r in readings:
            assert known[r.spec.name] is r.spec
            assert src.name in r.spec.source, (src.name, r.spec.name)
            assert set(r.attributes) <= set(r.spec.attributes), (r.spec.name, dict(r.attributes))
            assert all(isinstance(v, str) and v for v in r.attributes.values())
            assert isinstance(r.value, float) and math.isfinite(r.value) and r.value >= 0, r
        batch = src.read()
        keys = [(r.spec.name, tuple(sorted(r.attributes.items()))) for r in batch]
        assert len(keys) == len(set(keys)), f"{src.name}: duplicate series in one read"
        info = src.describe()
        assert isinstance(info["unreadable"], list)
        json.dumps(info)  # doctor prints it
        assert src.partial_errors == 0, (src.name, info)
