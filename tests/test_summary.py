"""The intro's results table is computed from the chapters' records and agrees with them."""

from __future__ import annotations

import json
import re

import pytest

from kernelbook import summary
from kernelbook.harness.paths import RESULTS, ROOT
from kernelbook.harness.records import DEFAULT_GPU, EVIDENCE, SPREAD, ratio_text

RECORDS = {p.stem: json.loads(p.read_text()) for p in sorted((RESULTS / DEFAULT_GPU).glob("*.json"))
           if p.stem not in (EVIDENCE, SPREAD)}
TABLE_CHAPTERS = {"00_method", "01_bn_modes", "02_bn_folding", "07_capstone_conv_bn_scale",
                  "08_capstone_conv3d_groupnorm_mean"}


def _fmt(value, spec):
    return "—" if value is None else format(value, spec)


def _times(med: dict, rng: dict, p: str) -> str:
    """The speed-up over ``p``: rounded as its spread allows where both times have a range, else to 2 decimals."""
    if rng.get(p) and rng["ours"]:
        return ratio_text(rng[p], rng["ours"])
    return _fmt(med[p] / med["ours"] if p in med else None, ".2f")


def _declared_rows(rec):
    """(problem, operation) → {provider: variant}, read here straight from the declarations."""
    out = {}
    for v, d in rec.get("variants", {}).items():
        if d.get("row"):
            problem, operation = (x.strip() for x in d["row"].split(" | "))
            assert d["provider"] not in out.get((problem, operation), {}), f"two {d['provider']} variants in {d['row']}"
            out.setdefault((problem, operation), {})[d["provider"]] = v
    return out


def markdown_rows(text: str) -> list[list[str]]:
    """The body rows of the first Markdown table in ``text``, as plain-text cells."""
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    out = []
    for ln in lines[2:]:  # after the header and the alignment row
        cells = [c.strip() for c in ln.strip().strip("|").split("|")]
        cells = [re.sub(r"\{doc\}`(\S+) <[^>]+>`", r"\1", c).replace("`", "") for c in cells]
        out.append(cells)
    return out


def test_the_chapters_with_headline_operations_declare_their_rows():
    with_rows = {c for c, rec in RECORDS.items() if _declared_rows(rec)}
    assert TABLE_CHAPTERS <= with_rows, f"chapters without a results-table row: {TABLE_CHAPTERS - with_rows}"
    for c in with_rows:
        for row, by in _declared_rows(RECORDS[c]).items():
            assert {"eager", "ours"} <= by.keys(), f"{c} {row}: a row needs an eager baseline and ours"
            assert all(v in RECORDS[c]["timings_ms"] for v in by.values()), f"{c} {row}: a variant without timings"


def test_numbers_are_the_records_cell_by_cell():
    ceil = summary.ceilings(DEFAULT_GPU)
    tc = {i: summary.tensor_core_rate(DEFAULT_GPU, instruction=i) for i in summary.TC_CEILINGS}
    ranges = summary.spread(DEFAULT_GPU).ranges  # the spread between processes, where it was measured
    with_range = any(f"{c}/{by['ours']}" in ranges for c, rec in RECORDS.items() for by in _declared_rows(rec).values())
    expected = []
    for c, rec in sorted(RECORDS.items()):
        for (problem, operation), by in _declared_rows(rec).items():
            med = {p: rec["timings_ms"][v]["median"] for p, v in by.items()}
            rng = {p: ranges.get(f"{c}/{v}") for p, v in by.items()}
            floor = summary.floor_ms(rec, by["ours"], ceil, tc)
            row = [problem, operation.replace("`", ""), c[:2], _fmt(med["eager"], ".3f"),
                   _fmt(med.get("compile"), ".3f"), _fmt(med["ours"], ".3f")]
            row += [f"{rng['ours'][0]:.3f}–{rng['ours'][1]:.3f}" if rng["ours"] else "—"] if with_range else []
            expected.append(row + [_times(med, rng, "eager"), _times(med, rng, "compile"),
                                   _fmt(100 * floor / med["ours"] if floor else None, ".0f")])
            if floor:
                assert floor <= med["ours"] * 1.05, f"{c} {operation}: faster than its floor allows"
    text = summary.markdown_table(DEFAULT_GPU)
    header = [c.strip() for c in text.splitlines()[0].strip().strip("|").split("|")]
    assert header == summary.COLUMNS[:6] + [summary.RANGE_COLUMN] * with_range + summary.COLUMNS[6:]
    assert markdown_rows(text) == expected and expected


def test_the_floor_is_the_roofline_bound_of_the_declared_counts():
    ceil = summary.ceilings(DEFAULT_GPU)
    assert ceil is not None, "the roofline chapter's record declares its FFMA kernel and copy as reference rates"
    rec03 = RECORDS["03_roofline"]
    ffma = rec03["variants"]["ffma_ours"]
    assert ceil[0] >= ffma["counts"]["flop"] / (rec03["timings_ms"]["ffma_ours"]["median"] * 1e-3) * (1 - 1e-12)
    assert 1e12 < ceil[1] < 1e14  # bytes/s of a real GPU's copy
    text = summary.markdown_table(DEFAULT_GPU)
    assert f"{ceil[0] / 1e12:.1f} TFLOP/s" in text and "nominal peak" in text


def test_a_synthetic_record_gives_the_rows_it_declares(tmp_path):
    assert summary.rows("h200", root=tmp_path) == []
    assert "No chapter has recorded" in summary.markdown_table("h200", root=tmp_path)
    (tmp_path / "h200").mkdir()
    t = lambda ms: {"median": ms, "q20": ms, "q80": ms}
    ref = {"chapter": "03_roofline", "provenance": {"gpu": "NVIDIA H200", "torch": "2.11.0", "date": "d"},
           "timings_ms": {"ffma": t(1.0), "copy": t(1.0)},
           "variants": {"ffma": {"provider": "ours", "math": "fp32", "role": "reference-rate",
                                 "counts": {"flop": 60e9}},
                        "copy": {"provider": "torch", "math": "fp32", "role": "reference-rate",
                                 "counts": {"bytes": 4e9}}}}
    row = "P27 | whole problem"
    rec = {"chapter": "08_capstone_conv3d_groupnorm_mean",
           "provenance": {"gpu": "NVIDIA H200", "torch": "2.11.0", "date": "d"},
           "timings_ms": {"eager": t(12.0), "compile": t(10.0), "ours": t(2.0)},
           "variants": {"eager": {"provider": "eager", "math": "fp32", "role": "baseline", "row": row},
                        "compile": {"provider": "compile", "math": "tf32", "role": "baseline", "row": row},
                        "ours": {"provider": "ours", "math": "fp32", "role": "headline", "row": row,
                                 "counts": {"flop": 60e9, "bytes": 2e9}}}}
    for r in (ref, rec):
        (tmp_path / "h200" / f"{r['chapter']}.json").write_text(json.dumps(r))
    (got,) = summary.rows("h200", root=tmp_path)
    assert got["problem"] == "P27" and got["× eager"] == 6.0 and got["× compile"] == 5.0
    assert got["% of floor"] == pytest.approx(50.0)  # max(60 GFLOP / 60 TFLOP/s, 2 GB / 4 TB/s) = 1 ms
    del rec["variants"]["compile"]
    (tmp_path / "h200" / f"{rec['chapter']}.json").write_text(json.dumps(rec))
    assert "| — |" in summary.markdown_table("h200", root=tmp_path)
    # a 3xTF32 row: no floor without the tensor-core chapter's rate; with it, held to that rate
    rec["variants"]["ours"]["math"] = "3xtf32"
    (tmp_path / "h200" / f"{rec['chapter']}.json").write_text(json.dumps(rec))
    assert summary.rows("h200", root=tmp_path)[0]["% of floor"] is None
    tc = {"chapter": "06_tensor_cores", "provenance": ref["provenance"], "timings_ms": {"mma_peak": t(1.0)},
          "variants": {"mma_peak": {"provider": "ours", "math": "tf32", "role": "reference-rate",
                                    "counts": {"flop": 360e9, "bytes": 0}}}}
    (tmp_path / "h200" / "06_tensor_cores.json").write_text(json.dumps(tc))
    assert summary.tensor_core_rate("h200", root=tmp_path) == pytest.approx(120e12)  # 360 TFLOP/s / 3
    (got,) = [r for r in summary.rows("h200", root=tmp_path) if r["problem"] == "P27"]
    assert got["% of floor"] == pytest.approx(100 * 0.5 / 2.0)  # max(60 G / 120 T, 2 GB / 4 TB/s) = 0.5 ms


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
    recorded = {rec["provenance"]["torch"] for rec in RECORDS.values()}
    assert summary.torch_versions(DEFAULT_GPU) == sorted(recorded)


def test_pages_with_a_repository_warning_read_the_configured_address():
    url = summary.repository_url()
    assert url.startswith("https://github.com/")
    page = (ROOT / "book" / "reproducing.md").read_text()
    assert "summary.PLACEHOLDER in url" in page, "the reproducing page warns while the address is a placeholder"


def test_intro_builds_the_table_at_build_time():
    intro = (ROOT / "book" / "intro.md").read_text()
    assert "```{code-cell} ipython3" in intro and "summary.show()" in intro


def test_a_wgmma_kernel_is_held_to_the_wgmma_ceiling():
    """A 3xTF32 variant that declares instruction "wgmma" takes its floor from wgmma's rate; others from
    mma.sync's; a rate given as one number is mma.sync's."""
    rec = {"variants": {"w": {"math": "3xtf32", "instruction": "wgmma", "counts": {"flop": 1e12, "bytes": 0}},
                        "v": {"math": "3xtf32", "counts": {"flop": 1e12, "bytes": 0}}}}
    ceil, rates = (65e12, 4e12), {"mma.sync": 100e12, "wgmma": 160e12}
    assert summary.floor_ms(rec, "w", ceil, rates) == pytest.approx(1e3 / 160)
    assert summary.floor_ms(rec, "v", ceil, rates) == pytest.approx(1e3 / 100)
    assert summary.floor_ms(rec, "w", ceil, 100e12) is None and summary.floor_ms(rec, "v", ceil, 100e12)
