"""The intro's results table is computed from the chapters' records and agrees with them."""

from __future__ import annotations

import json
import re

import pytest

from kernelbook import summary
from kernelbook.paths import RESULTS, ROOT
from kernelbook.records import DEFAULT_GPU


def _median(chapter, variant):
    rec = json.loads((RESULTS / DEFAULT_GPU / f"{chapter}.json").read_text())
    return rec["timings_ms"][variant]["median"]


def _fmt(value, spec):
    return "—" if value is None else format(value, spec)


def expected_cells(row: summary.Row) -> list[str]:
    """A row's cells as the intro must show them, computed here from its chapter's record (plain text:
    the chapter as its number, the operation without Markdown's backticks)."""
    rec = json.loads((RESULTS / DEFAULT_GPU / f"{row.chapter}.json").read_text())
    eager, ours = _median(row.chapter, row.eager), _median(row.chapter, row.ours)
    comp = _median(row.chapter, row.compiled) if row.compiled else None
    if row.floor_passes:
        floor = _median(row.chapter, summary.COPY) * row.floor_passes / 2
    else:  # the roofline or stored floor: checked against its own arithmetic in the last test below
        floor = summary.floor_ms(row, rec, summary.ceilings(DEFAULT_GPU))
    return [row.problem, row.what.replace("`", ""), row.chapter[:2], _fmt(eager, ".3f"), _fmt(comp, ".3f"),
            _fmt(ours, ".3f"), _fmt(eager / ours, ".2f"), _fmt(comp / ours if comp else None, ".2f"),
            _fmt(100 * floor / ours if floor else None, ".0f")]


def markdown_rows(text: str) -> list[list[str]]:
    """The body rows of the first Markdown table in ``text``, as plain-text cells."""
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    out = []
    for ln in lines[2:]:  # after the header and the alignment row
        cells = [c.strip() for c in ln.strip().strip("|").split("|")]
        cells = [re.sub(r"\{doc\}`(\S+) <[^>]+>`", r"\1", c).replace("`", "") for c in cells]
        out.append(cells)
    return out


def test_every_recorded_chapter_in_the_table_has_the_variants_it_names():
    assert summary.missing(DEFAULT_GPU) == [], "a row names variants its chapter's record lacks: fix summary.ROWS"


def test_table_has_a_row_for_every_recorded_chapter_it_knows():
    recorded = {p.stem for p in (RESULTS / DEFAULT_GPU).glob("*.json")}
    shown = {r["chapter"] for r in summary.rows(DEFAULT_GPU)}
    assert shown == recorded & {row.chapter for row in summary.ROWS}
    assert {"00_method", "01_bn_modes"} <= shown


@pytest.mark.parametrize("row", [r for r in summary.ROWS if (RESULTS / DEFAULT_GPU / f"{r.chapter}.json").is_file()],
                         ids=lambda r: f"{r.chapter}:{r.ours}")
def test_numbers_are_the_records(row):
    got = next(r for r in summary.rows(DEFAULT_GPU) if r["chapter"] == row.chapter and r["operation"] == row.what)
    eager, ours = _median(row.chapter, row.eager), _median(row.chapter, row.ours)
    assert got["eager ms"] == eager and got["ours ms"] == ours
    assert got["× eager"] == pytest.approx(eager / ours)
    if row.compiled:
        assert got["× compile"] == pytest.approx(_median(row.chapter, row.compiled) / ours)
    if row.floor_passes:
        floor = _median(row.chapter, summary.COPY) * row.floor_passes / 2
        assert got["% of floor"] == pytest.approx(100 * floor / ours)
        assert 0 < got["% of floor"] <= 105, "faster than the copy rate allows: a wrong pass count?"
    shown = markdown_rows(summary.markdown_table(DEFAULT_GPU))
    assert expected_cells(row) in shown, f"{row.chapter}: the table's row is not the record's"


def test_the_table_is_exactly_the_recorded_rows_cell_by_cell():
    text = summary.markdown_table(DEFAULT_GPU)
    header = [c.strip() for c in text.splitlines()[0].strip().strip("|").split("|")]
    assert header == summary.COLUMNS
    recorded = [r for r in summary.ROWS if (RESULTS / DEFAULT_GPU / f"{r.chapter}.json").is_file()]
    assert markdown_rows(text) == [expected_cells(r) for r in recorded]


def test_the_note_under_the_table_says_what_each_floor_divides_by():
    text = summary.markdown_table(DEFAULT_GPU)
    kinds = {r["floor"] for r in summary.rows(DEFAULT_GPU)}
    if "copy" in kinds:
        assert "device-to-device copy rate" in text
    if "roofline" in kinds:
        peak, bandwidth = summary.ceilings(DEFAULT_GPU)
        assert f"{peak / 1e12:.1f} TFLOP/s" in text and f"{bandwidth / 1e9:,.0f} GB/s" in text
        assert "nominal FFMA peak" in text


def test_built_on_says_how_this_build_ran():
    import kernelbook as kb

    text = summary.built_on()
    if kb.gpu() is None:
        assert "without a GPU" in text
    else:
        assert kb.gpu()["gpu"] in text and "without" not in text


def test_versions_read_from_constraints_and_records(tmp_path):
    assert summary.pinned("torch") is not None, "constraints.txt pins torch"
    assert summary.pinned("no-such-package") is None
    (tmp_path / "constraints.txt").write_text("# comment\nTorch==1.2.3  # pinned\nnumpy==2.0\n")
    assert summary.pinned("torch", root=tmp_path) == "1.2.3"
    recorded = {json.loads(p.read_text())["provenance"]["torch"] for p in (RESULTS / DEFAULT_GPU).glob("*.json")}
    assert summary.torch_versions(DEFAULT_GPU) == sorted(recorded)


def test_pages_with_a_repository_warning_read_the_configured_address():
    url = summary.repository_url()
    assert url.startswith("https://github.com/")
    page = (ROOT / "book" / "reproducing.md").read_text()
    assert "summary.PLACEHOLDER in url" in page, "the reproducing page warns while the address is a placeholder"


def test_table_grows_with_records_and_reads_a_stored_floor(tmp_path):
    assert summary.rows("h200", root=tmp_path) == []
    assert "No chapter has recorded" in summary.markdown_table("h200", root=tmp_path)
    (tmp_path / "h200").mkdir()
    t = lambda ms: {"median": ms, "q20": ms, "q80": ms}
    rec = {"chapter": "07_capstone_conv3d_groupnorm_mean", "floor_ms": {"ours": 1.0},
           "provenance": {"gpu": "NVIDIA H200", "torch": "2.11.0", "date": "2026-11-29 12:00 UTC"},
           "timings_ms": {"eager": t(12.0), "compile": t(10.0), "ours": t(2.0)}}
    (tmp_path / "h200" / "07_capstone_conv3d_groupnorm_mean.json").write_text(json.dumps(rec))
    (row,) = summary.rows("h200", root=tmp_path)
    assert row["problem"] == "P27" and row["× eager"] == 6.0 and row["× compile"] == 5.0
    assert row["% of floor"] == 50.0
    del rec["timings_ms"]["compile"]
    (tmp_path / "h200" / "07_capstone_conv3d_groupnorm_mean.json").write_text(json.dumps(rec))
    assert summary.missing("h200", root=tmp_path) == ["07_capstone_conv3d_groupnorm_mean: compile"]
    assert "| — |" in summary.markdown_table("h200", root=tmp_path)


def test_intro_builds_the_table_at_build_time():
    intro = (ROOT / "book" / "intro.md").read_text()
    assert "```{code-cell} ipython3" in intro and "summary.show()" in intro


def test_a_compute_row_gets_the_roofline_floor_from_the_measured_ceilings():
    from kernelbook import roofline

    ceil = summary.ceilings(DEFAULT_GPU)
    if ceil is None:
        pytest.skip("the roofline chapter has no record yet")
    rec03 = json.loads((RESULTS / DEFAULT_GPU / "03_roofline.json").read_text())
    peak = rec03["counts"]["ffma_ours"]["flop"] / (rec03["timings_ms"]["ffma_ours"]["median"] * 1e-3)
    assert ceil[0] == pytest.approx(peak) and 1e12 < ceil[1] < 1e14  # bytes/s of a real GPU's copy
    for row in summary.ROWS:
        path = RESULTS / DEFAULT_GPU / f"{row.chapter}.json"
        if row.floor_passes is not None or not path.is_file():
            continue
        rec = json.loads(path.read_text())
        got = summary.floor_ms(row, rec, ceil)
        placed = roofline.placed(rec).get(row.ours)
        if placed is not None and placed.math == "fp32" and row.ours not in rec.get("floor_ms", {}):
            c = placed.counts
            assert got == pytest.approx(1e3 * max(c.flop / ceil[0], c.bytes / ceil[1]))
            assert got <= _median(row.chapter, row.ours), "faster than the roofline allows"
