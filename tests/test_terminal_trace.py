"""`otel-gpu trace analyze|diff` fit the terminal they print on: at 80 and 120 columns no line is
longer than the terminal, table titles stay whole on their line, headers wrap at their spaces (never
cut), the columns left out are named; a longer title wraps between its phrases under a hanging
indent; a path is never cut (it may pass the width, alone, so that it can be copied); --quiet prints
the findings only; the HTA rounding note only with --verbose."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st
from rich.cells import cell_len
from rich.console import Console

from otel_gpu.cli import main
from otel_gpu.terminal import Col, FitTable, break_offsets, fit_columns, hang, min_width, title_lines
from tests.shared_data import needs_shared_data, shared_data

sys.path.insert(0, str(Path(__file__).parent / "trace"))
from kineto import stall_trace, training_trace  # noqa: E402

REAL = "tests/data/traces"
WIDTHS = (80, 120)
TITLES = ("Temporal breakdown (us, % of first-kernel-to-last-kernel span)", "GPU time by kernel type (all ranks)",
          "GPU idle time by stream", "Communication / computation overlap", "Kernel launches",
          "Steps across ranks (busy = step - communication, us)")
BOX_TOP = re.compile(r"^[┏┌]")


@pytest.fixture(scope="module")
def gpu_set(tmp_path_factory):
    """Two ranks with GPU kernels, long kernel names and a few findings."""
    d = tmp_path_factory.mktemp("gpu")
    training_trace(0, pageable=True, short_kernels=True).write(str(d / "r0.json"))
    training_trace(1, compute_scale=1.2, syncs=True, alloc_thrash=True).write(str(d / "r1.json"))
    return str(d)


@pytest.fixture(scope="module")
def stalls(tmp_path_factory):
    """20 ranks (more than a screen's worth: the notable ones are shown), findings with causes."""
    d = tmp_path_factory.mktemp("stalls")
    for r in range(20):
        stall_trace(r, free_calls=12 + r % 5, short_kernels=r < 10).write(str(d / f"rank{r}.json"))
    return str(d)


def analyze(capsys, monkeypatch, width: int, *args: str) -> list[str]:
    monkeypatch.setenv("COLUMNS", str(width))
    assert main(["trace", *args]) == 0
    return capsys.readouterr().out.splitlines()


def check_fits(lines: list[str], width: int) -> None:
    long = [line for line in lines if cell_len(line) > width]
    assert not long, f"{len(long)} lines over {width} columns:\n" + "\n".join(long[:5])
    for i, line in enumerate(lines):
        if BOX_TOP.match(line):   # a table: its header rows (up to the rule under them) are never cut
            j = i + 1
            while not lines[j].startswith(("┡", "├")):
                assert "…" not in lines[j], f"a header cut at {width} columns: {lines[j]!r}"
                j += 1


@pytest.mark.parametrize("width", WIDTHS)
def test_analyze_fits_80_and_120_columns(gpu_set, capsys, monkeypatch, width):
    lines = analyze(capsys, monkeypatch, width, "analyze", gpu_set, "--kernel-sequences", "ProfilerStep")
    check_fits(lines, width)
    for title in TITLES:
        assert title in lines, f"title not whole on its own line at {width} columns: {title}"
    assert any(line.startswith("Findings") for line in lines)
    assert lines[0].startswith("Trace set ") and "2 ranks (0-1)" in lines[0]


@pytest.mark.parametrize("width", WIDTHS)
def test_many_ranks_and_findings_with_causes_fit(stalls, capsys, monkeypatch, width):
    lines = analyze(capsys, monkeypatch, width, "analyze", stalls)
    check_fits(lines, width)
    text = "\n".join(lines)
    assert "leads to:" in text and "fix:" in text
    bullets = [i for i, line in enumerate(lines) if re.match(r"\d+\. ", line)]
    assert bullets
    for i in bullets:   # a finding's continuation lines hang under its text, not at column 0
        j = i + 1
        while j < len(lines) and lines[j] and not re.match(r"\d+\. |\S", lines[j]):
            j += 1
        assert all(line.startswith("   ") for line in lines[i + 1:j])


def test_a_narrow_terminal_leaves_columns_out_and_says_which(gpu_set, capsys, monkeypatch):
    lines = analyze(capsys, monkeypatch, 60, "analyze", gpu_set)
    check_fits(lines, 60)
    text = " ".join(" ".join(lines).split())
    assert text.count("left out at 60 columns:") >= 2 and "kernel_type; --csv has them)" in text


def test_diff_fits(gpu_set, capsys, monkeypatch):
    for width in WIDTHS:
        lines = analyze(capsys, monkeypatch, width, "diff", gpu_set, gpu_set)
        check_fits(lines, width)
        assert "(2 ranks)" in lines[0] and any(re.fullmatch(r"Biggest changes \(top \d+\)", x) for x in lines)


def test_quiet_prints_the_findings_only(gpu_set, capsys, monkeypatch):
    full = analyze(capsys, monkeypatch, 100, "analyze", gpu_set)
    quiet = analyze(capsys, monkeypatch, 100, "analyze", gpu_set, "--quiet")
    assert quiet and quiet == full[full.index(next(x for x in full if x.startswith("Findings"))):]
    assert not any(BOX_TOP.match(line) for line in quiet)


def test_quiet_without_findings_says_so(capsys, monkeypatch):
    quiet = analyze(capsys, monkeypatch, 80, "analyze", f"{REAL}/cpu_gloo_clean", "--quiet", "--min-impact", "50")
    assert "No anti-pattern found" in " ".join(quiet) and not any(line.startswith("Trace set") for line in quiet)


def test_the_hta_rounding_note_only_with_verbose(capsys, monkeypatch):
    plain = "\n".join(analyze(capsys, monkeypatch, 120, "analyze", f"{REAL}/cpu_gloo_clean"))
    verbose = analyze(capsys, monkeypatch, 120, "analyze", f"{REAL}/cpu_gloo_clean", "--verbose")
    assert "shorter than 1 us" not in plain and "note:" in plain   # the other notes stay
    assert "shorter than 1 us" in "\n".join(verbose)
    check_fits(verbose, 120)


def test_written_outputs_are_named_with_absolute_paths(gpu_set, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["trace", "analyze", str(Path(gpu_set).resolve()), "--quiet", "--json", "o.json", "--csv", "c"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"otel-gpu trace: wrote --json {tmp_path / 'o.json'}; ")
    assert re.search(rf"\d+ CSV files in {re.escape(str(tmp_path / 'c'))}$", err[-1])


@needs_shared_data("traces")
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", ["hta_ns_resolution_single_rank", "hta_sampled_2rank", "hta_alexnet_single_rank"])
def test_real_traces_fit(capsys, monkeypatch, width, name):
    lines = analyze(capsys, monkeypatch, width, "analyze", str(shared_data("traces", name)))
    check_fits(lines, width)
    assert "ATen ops and the kernels they launch (all ranks, 10 most frequent)" in lines


def render(width: int, renderable) -> list[str]:
    con = Console(width=width, record=True, file=open("/dev/null", "w"))
    con.print(renderable)
    return con.export_text().splitlines()


words = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=30)
cell = st.one_of(st.integers(-10**9, 10**9).map(lambda n: f"{n:,}"), st.lists(words, min_size=1, max_size=6).map(" ".join))


@settings(max_examples=60, deadline=None)
@given(width=st.integers(40, 200), data=st.data(),
       cols=st.lists(st.tuples(st.lists(words, min_size=1, max_size=4).map(" ".join), st.integers(0, 3), st.booleans()),
                     min_size=1, max_size=9))
def test_a_table_fits_whenever_its_kept_columns_can(width, data, cols):
    spec = [Col(h[:12], p if i else 0, text=t) for i, (h, p, t) in enumerate(cols)]
    rows = data.draw(st.lists(st.lists(cell, min_size=len(spec), max_size=len(spec)), max_size=5))
    kept = fit_columns(width, spec, rows)
    need = sum(min_width(spec[i], [r[i] for r in rows]) + 3 for i in kept) + 1
    assert [i for i, c in enumerate(spec) if c.priority == 0] == [i for i in kept if spec[i].priority == 0]
    lines = render(width, FitTable("title", spec, rows))
    if need <= width:
        assert all(cell_len(line) <= width for line in lines)
    left = [c.header for i, c in enumerate(spec) if i not in kept]
    assert bool(left) == any("left out at" in line for line in lines)


@settings(max_examples=60, deadline=None)
@given(width=st.integers(30, 200), lead=st.sampled_from(["", "  note: ", "1. ", "      "]),
       text=st.lists(words, max_size=40).map(" ".join))
def test_hanging_text_fits_and_hangs(width, lead, text):
    con = Console(width=width, record=True, file=open("/dev/null", "w"))
    hang(con, lead, text)
    lines = con.export_text().splitlines()
    room = max(width, len(lead) + 20)
    for line in lines:   # only a path longer than the line passes the width: whole, alone on its line
        assert cell_len(line) <= room or (len(line.split()) == 1 + (line is lines[0] and bool(lead.strip()))
                                          and re.search(r"[/\\]", line.split()[-1])), line
    assert lines[0].startswith(lead) and all(line.startswith(" " * len(lead)) for line in lines[1:])
    assert " ".join(" ".join(line[len(lead):].split()) for line in lines).replace(" ", "") == text.replace(" ", "")


@pytest.fixture(scope="module")
def deep_set(tmp_path_factory):
    """Two ranks in a folder whose path is longer than 80 columns; rank 0 has an event of negative "dur"
    (a note naming its file)."""
    d = tmp_path_factory.mktemp("deep") / ("a_folder_with_a_long_name_" * 2) / ("another_long_folder_name_" * 2)
    d.mkdir(parents=True)
    r0 = training_trace(0, short_kernels=True)
    r0.events.append({"ph": "X", "cat": "cpu_op", "name": "bad_duration", "pid": 1, "tid": 1, "ts": 5, "dur": -5})
    r0.write(str(d / "r0.json"))
    training_trace(1).write(str(d / "r1.json"))
    return str(d)


def test_at_80_columns_paths_stay_whole_and_a_long_title_wraps_between_phrases(deep_set, capsys, monkeypatch):
    assert len(deep_set) > 80
    lines = analyze(capsys, monkeypatch, 80, "analyze", deep_set, "--kernel-sequences", "ProfilerStep")
    assert lines[:2] == [f"Trace set {deep_set}", "          2 ranks (0-1)"]
    (note,) = [line for line in lines if line.startswith("  note: ") and "r0.json" in line]
    assert note == f"  note: {deep_set}/r0.json:"   # the path whole, on the note's first line
    assert lines[lines.index(note) + 1] == "        1 event not analysed (negative dur: 1)"   # the rest hangs under it
    check_fits([line for line in lines if deep_set not in line], 80)   # every other line within 80 columns
    title = "Frequent kernel sequences under 'ProfilerStep' (top 5 of 6 patterns,"
    assert title in lines   # the title wraps between phrases, its second line under a 2-space indent
    assert lines[lines.index(title) + 1] == "  ops launching >= 3 kernels; counts and us summed over ranks)"
    assert lines[lines.index(title) + 2].startswith("┏")


def test_diff_keeps_both_paths_whole(deep_set, gpu_set, capsys, monkeypatch):
    lines = analyze(capsys, monkeypatch, 80, "diff", gpu_set, deep_set)
    assert lines[0] == f"A {gpu_set} (2 ranks)  ->  B"
    assert lines[1] == f"  {deep_set}" and lines[2].startswith("  (2 ranks); per-rank figures")


phrase = st.lists(st.text(st.characters(min_codepoint=33, max_codepoint=126, blacklist_characters="/\\;,("),
                          min_size=1, max_size=25), min_size=1, max_size=6).map(" ".join)


@settings(max_examples=100, deadline=None)
@given(width=st.integers(20, 160), parts=st.lists(st.tuples(phrase, st.sampled_from([", ", "; ", " ("])),
                                                  min_size=1, max_size=8))
def test_a_title_wraps_only_between_phrases_or_words_where_it_must(width, parts):
    title = "".join(p + sep for p, sep in parts).rstrip(" (")
    lines = title_lines(title, width)
    assert all(cell_len(line) <= width for line in lines)
    assert lines[0] == title or all(line.startswith("  ") and line[2] != " " for line in lines[1:])
    assert " ".join(line.strip() for line in lines).replace(" ", "") == title.replace(" ", "")
    for a, b in zip(lines, lines[1:]):   # a break where the next word fits on the line is at a phrase's end
        nxt = b.split()[0]
        assert cell_len(f"{a} {nxt}") > width or a.endswith((",", ";")) or nxt.startswith("(")


@settings(max_examples=100, deadline=None)
@given(width=st.integers(20, 120), before=phrase, after=phrase,
       path=st.lists(st.text("abcdefghij_.-0123456789", min_size=1, max_size=30), min_size=2, max_size=8)
       .map(lambda p: "/" + "/".join(p)))
def test_a_path_is_never_cut(width, before, after, path):
    text = f"{before} {path} {after}"
    cuts = [0, *break_offsets(text, width), len(text)]
    lines = [text[a:b].strip() for a, b in zip(cuts, cuts[1:])]
    assert sum(path in line.split() for line in lines) == 1
    assert all(cell_len(line) <= width for line in lines if path not in line)
