"""Threshold defaults and override files (TOML and YAML), with one-line errors for bad files."""
from __future__ import annotations

import pytest

from otel_gpu.diagnose.thresholds import DEFAULTS, ThresholdError, Thresholds, describe_defaults, load_thresholds, parse_overrides


def test_defaults_are_documented_numbers():
    rows = describe_defaults()
    assert len(rows) == sum(len(k) for k in DEFAULTS.values())
    assert all(isinstance(v, (int, float)) and meaning for _, _, v, meaning in rows)
    t = Thresholds()
    assert t["checkpoint"]["share_warning"] == t.get("checkpoint", "share_warning") == 0.03


def test_toml_and_yaml_overrides(tmp_path):
    toml = tmp_path / "t.toml"
    toml.write_text("[straggler]\nlateness_share = 0.1\n[sm_idle]\nratio_max = 0.4\n")
    t = load_thresholds(toml)
    assert t["straggler"]["lateness_share"] == 0.1 and t["sm_idle"]["ratio_max"] == 0.4
    assert t["straggler"]["lateness_min_s"] == DEFAULTS["straggler"]["lateness_min_s"][0]
    yml = tmp_path / "t.yml"
    yml.write_text("input:\n  cpu_saturated: 0.7\n")
    assert load_thresholds(yml)["input"]["cpu_saturated"] == 0.7
    empty = tmp_path / "e.yaml"
    empty.write_text("")
    assert load_thresholds(empty).as_dict() == Thresholds().as_dict()
    assert Thresholds()["input"]["cpu_saturated"] == DEFAULTS["input"]["cpu_saturated"][0]   # no shared state


@pytest.mark.parametrize("text, suffix, message", [
    ("[nope]\nx = 1\n", ".toml", "unknown rule 'nope'"),
    ("[comm]\nwait = 1\n", ".toml", "unknown key comm.wait"),
    ("[comm]\nlink_busy = 'high'\n", ".toml", "is not a number"),
    ("[comm]\nlink_busy = true\n", ".toml", "is not a number"),
    ("[comm]\nlink_busy = -1\n", ".toml", "must not be negative"),
    ("[comm\n", ".toml", "not valid TOML"),
    ("comm: [1, 2\n", ".yaml", "not valid YAML"),
    ("- 1\n- 2\n", ".yaml", "expected a table"),
    ("comm: 3\n", ".yaml", "must be a table"),
    ("x = 1", ".ini", "expected a .toml"),
])
def test_bad_overrides_one_line(text, suffix, message):
    with pytest.raises(ThresholdError) as e:
        parse_overrides(text, suffix, "t" + suffix)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("what", ["/dev/zero", "big", "binary", "directory"])
def test_a_file_that_is_no_thresholds_file_is_one_line(tmp_path, what):
    """The file is read with a bound: a device that never ends, a huge file, bytes that are not text and a
    folder are each one line, nothing read beyond the bound."""
    path = {"/dev/zero": "/dev/zero", "big": tmp_path / "big.toml", "binary": tmp_path / "b.toml",
            "directory": tmp_path}[what]
    if what == "big":
        path.write_text("# " + "x" * (2 << 20) + "\n")
    elif what == "binary":
        path.write_bytes(b"\xff\xfe[comm]\n")
    with pytest.raises(ThresholdError) as e:
        load_thresholds(path)
    message = str(e.value)
    assert "\n" not in message and ("cannot read" in message or "not UTF-8" in message), message


def test_docs_table_matches_the_defaults():
    from pathlib import Path

    from otel_gpu.diagnose.thresholds import markdown_table

    doc = (Path(__file__).resolve().parents[2] / "docs" / "diagnose.md").read_text()
    assert markdown_table() in doc, "docs/diagnose.md threshold table is stale: paste markdown_table()"
