"""Trial placeholders reach the trial's command as exactly their value, wherever the user put them:
outside quotes, inside their own "..." or '...'. Checked with a real /bin/sh."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from otel_gpu.tune.trial import fill_quoted, render_command

# what the shell must hand printf for each template: the value alone, or with the text around it
TEMPLATES = [('printf "%s\\0" {config}', "{}"), ('printf "%s\\0" "{config}"', "{}"), ("printf '%s\\0' '{config}'", "{}"),
             ('printf "%s\\0" --out="{config}/x"', "--out={}/x"), ('printf "%s\\0" pre-{config}-post', "pre-{}-post"),
             ("printf '%s\\0' 'a'\"{config}\"'b'", "a{}b")]


def _sh(command: str) -> list[str]:
    out = subprocess.run(["/bin/sh", "-c", command], capture_output=True, timeout=10, check=True).stdout
    return out.decode("utf-8", "surrogateescape").split("\0")[:-1]


@settings(max_examples=60, deadline=None)
@given(value=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), min_size=1, max_size=20),
       template=st.sampled_from(TEMPLATES))
def test_a_placeholder_is_its_value_inside_any_quotes(value, template):
    command, want = template
    assert _sh(fill_quoted(command, {"config": value})) == [want.format(value)]


@pytest.mark.parametrize("command", ['printf "%s\\0" "{config}" "{trial_dir}"', "printf '%s\\0' {config} '{trial_dir}'"])
def test_paths_with_spaces_and_substitutions_stay_one_word_and_never_run(tmp_path, command):
    trial_dir = tmp_path / "my trials $(touch pwned)" / "0001"
    config = trial_dir / "ds `touch pwned2`.json"
    assert _sh(render_command(command, config, trial_dir, 1, "t1")) == [str(config), str(trial_dir)]
    assert not list(Path.cwd().glob("pwned*")) and not list(tmp_path.rglob("pwned*"))
