"""The spread between processes: its file, its ranges, the rounding of ratios, the intro table, and the script."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from kernelbook import build, records, summary
from kernelbook.harness.paths import ROOT
from kernelbook.harness.records import DEFAULT_GPU, ratio_text

CHAPTER = "08_capstone_conv3d_groupnorm_mean"


def _script():
    spec = importlib.util.spec_from_file_location("spread_script", ROOT / "scripts" / "spread.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("num, den, text", [
    ((2.76, 2.83), (1, 1), "2.8"),           # the ends agree to 2 figures
    ((2.841, 2.846), (1, 1), "2.84"),        # to 3
    ((2.76, 2.93), (1, 1), "2.8–2.9"),       # not even to 2: the range, to 2 figures
    ((3.0, 3.0), (1, 1), "3.00"),            # no spread: 3 figures, trailing zero kept
    ((0.75, 0.75), (1, 1), "0.750"),
    ((9.95, 10.05), (1, 1), "10"),           # across a decade
    ((9.96, 9.96), (1, 1), "9.96"),
    ((0.98, 1.03), (1, 1), "1.0"),
    ((0.7, 1.4), (1, 1), "0.70–1.4"),
    ((2.37, 2.40), (0.676, 0.714), "3.3–3.6"),  # both times spread: least over greatest, greatest over least
    ((6.0, 6.0), (2.0, 2.0), "3.00"),
])
def test_ratio_text_quotes_the_figures_the_spread_allows(num, den, text):
    assert ratio_text(num, den) == text


def test_a_quoted_ratio_is_within_one_unit_of_its_last_figure_of_every_ratio_allowed():
    for lo, width in [(2.7, 0.05), (1.234, 0.004), (0.0312, 0.0007), (45.0, 0.9), (99.5, 0.2)]:
        text = ratio_text((lo, lo + width), (1, 1))
        assert "–" not in text
        unit = 10 ** -len(text.partition(".")[2]) if "." in text else 1
        assert all(abs(float(text) - x) < unit for x in (lo, lo + width)), (lo, width, text)


def test_ratio_text_refuses_what_is_not_a_time():
    with pytest.raises(ValueError):
        ratio_text((1.0, 2.0), (0.0, 1.0))
    with pytest.raises(ValueError):
        ratio_text((2.0, 1.0), (1.0, 1.0))


def _t(ms: float) -> dict:
    return {"median": ms, "q20": ms, "q80": ms}


def _books(tmp_path, runs: list[dict] | None) -> None:
    """A results folder with a roofline record, chapter 8's row (eager, compile, ours) and, if given, a spread
    file of ``runs``; chapter 8's record names kernels/scale's real sources, so staleness is checked for real."""
    d = tmp_path / "h200"
    d.mkdir(exist_ok=True)
    prov = {"gpu": "NVIDIA H200", "torch": "2.11.0", "date": "2026-01-02 10:00 UTC",
            "kernels": build.source_hashes("scale")}
    ref = {"chapter": "03_roofline", "provenance": prov, "timings_ms": {"ffma": _t(1.0), "copy": _t(1.0)},
           "variants": {"ffma": {"provider": "ours", "math": "fp32", "role": "reference-rate",
                                 "counts": {"flop": 60e9}},
                        "copy": {"provider": "torch", "math": "fp32", "role": "reference-rate",
                                 "counts": {"bytes": 4e9}}}}
    row = "P27 | whole problem"
    rec = {"chapter": CHAPTER, "provenance": prov,
           "timings_ms": {"eager": _t(12.0), "compile": _t(10.0), "ours": _t(2.0), "compile_max": _t(9.0),
                          "eager_step": _t(20.0), "compile_fp32": _t(10.0), "eager_cl3d": _t(6.0)},
           "variants": {"eager": {"provider": "eager", "mode": "", "role": "baseline", "row": row},
                        "compile": {"provider": "compile", "mode": "", "role": "baseline", "row": row,
                                    "tf32_allowed": True},
                        "compile_fp32": {"provider": "compile", "mode": "", "role": "baseline",
                                         "tf32_allowed": False},
                        "compile_max": {"provider": "compile", "mode": "max-autotune", "role": "baseline"},
                        "eager_cl3d": {"provider": "eager", "mode": "channels_last_3d", "role": "baseline"},
                        "eager_step": {"provider": "eager", "mode": "step", "role": "baseline"},
                        "ours": {"provider": "ours", "mode": "", "role": "headline", "row": row,
                                 "counts": {"flop": 60e9, "bytes": 2e9}}}}
    for r in (ref, rec):
        (d / f"{r['chapter']}.json").write_text(json.dumps(r))
    if runs is not None:
        path = records.spread_path("h200", tmp_path)
        path.unlink(missing_ok=True)
        for run in runs:
            records.append_run(run, path)


def _run(ours: float, eager: float = 12.0, date: str = "2026-01-03 09:00 UTC", kernels: dict | None = None) -> dict:
    prov = {"gpu": "NVIDIA H200", "torch": "2.11.0", "date": date, "commit": "abc",
            "kernels": build.source_hashes("scale") if kernels is None else kernels}
    return {"pid": 1, "provenance": prov, "timings_ms": {f"{CHAPTER}/ours": _t(ours), f"{CHAPTER}/eager": _t(eager),
                                                          f"{CHAPTER}/compile": _t(10.0)}}


def test_append_run_keeps_every_run(tmp_path):
    path = tmp_path / "deep" / "spread.json"
    assert records.spread_runs(path) == []
    assert records.append_run(_run(2.0), path) == 1
    assert records.append_run(_run(2.1), path) == 2
    assert [r["timings_ms"][f"{CHAPTER}/ours"]["median"] for r in records.spread_runs(path)] == [2.0, 2.1]


def test_ranges_are_the_least_and_greatest_median_over_enough_fresh_runs(tmp_path):
    stale = {**build.source_hashes("scale"), "kernels/scale.cu": "0" * 64}
    _books(tmp_path, [_run(2.0), _run(2.1, eager=11.8), _run(1.9, date="2026-01-04 09:00 UTC"),
                      _run(9.9, kernels=stale)])  # the stale run is not counted
    sp = summary.spread("h200", tmp_path)
    assert sp.ranges[f"{CHAPTER}/ours"] == (1.9, 2.1, 3)
    assert sp.ranges[f"{CHAPTER}/eager"] == (11.8, 12.0, 3)
    assert sp.dates == ("2026-01-03", "2026-01-04") and sp.stale == ()
    _books(tmp_path, [_run(2.0), _run(2.1)])  # two runs are not enough
    assert summary.spread("h200", tmp_path).ranges == {}


def test_a_chapter_whose_kernels_changed_loses_its_ranges_and_says_so(tmp_path):
    stale = {**build.source_hashes("scale"), "kernels/scale.cu": "0" * 64}
    _books(tmp_path, [_run(2.0, kernels=stale) for _ in range(3)])
    sp = summary.spread("h200", tmp_path)
    assert sp.ranges == {} and sp.stale == (CHAPTER,)
    text = summary.markdown_table("h200", root=tmp_path)
    assert summary.RANGE_COLUMN not in text and "Chapter 08 shows no range" in text


def test_the_table_with_and_without_a_spread_file(tmp_path):
    _books(tmp_path, None)
    plain = summary.markdown_table("h200", root=tmp_path)
    assert plain.splitlines()[0] == "| " + " | ".join(summary.COLUMNS) + " |"
    assert "separate processes" not in plain and "| 6.00 | 5.00 |" in plain
    (row,) = summary.rows("h200", root=tmp_path)
    assert row["ours range"] is None and summary.times_text(row, "eager") == "6.00"

    _books(tmp_path, [_run(2.0), _run(2.1, eager=11.8), _run(1.95)])
    text = summary.markdown_table("h200", root=tmp_path)
    header = [c.strip() for c in text.splitlines()[0].strip("|").split("|")]
    assert header == [*summary.COLUMNS[:6], summary.RANGE_COLUMN, *summary.COLUMNS[6:]]
    # eager 11.8–12.0 over ours 1.95–2.1: 5.62–6.15, so not even 2 figures; compile 10.0 / (1.95–2.1): 4.8–5.1
    assert "| 2.000 | 1.950–2.100 | 5.6–6.2 | 4.8–5.1 |" in text
    assert "3 separate processes measured on 2026-01-03" in text
    assert summary.ratio(CHAPTER, "eager", "ours", root=tmp_path, gpu_slug="h200") == "5.6–6.2"
    assert summary.ratio(CHAPTER, "eager_cl3d", "ours", ".1f", root=tmp_path, gpu_slug="h200") == "3.0"


def test_the_capstones_peers_are_their_forward_baselines_without_a_compile_of_their_own(tmp_path):
    _books(tmp_path, None)
    assert summary.spread_variants("h200", tmp_path) == {
        CHAPTER: ["eager", "compile", "compile_fp32", "eager_cl3d", "ours"]}


def test_the_script_builds_exactly_the_variants_the_records_ask_for():
    """scripts/spread.py and the records cannot drift: it times the intro's rows and the capstones' peers."""
    script = _script()
    wanted = summary.spread_variants(DEFAULT_GPU)
    assert script.mismatch(wanted) == []
    assert {c: set(b.variants) for c, b in script.BUILDERS.items()} == {c: set(vs) for c, vs in wanted.items()}
    rows = {(rec["chapter"], v) for rec in records.on_gpu(DEFAULT_GPU)
            for by in summary.table_rows(rec).values() for v in by.values()}
    assert rows <= {(c, v) for c, vs in wanted.items() for v in vs}, "every variant of the intro's table is timed"


def test_the_script_without_a_gpu_says_so_and_times_nothing(tmp_path):
    out = tmp_path / "spread.json"
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "spread.py"), "--out", str(out)],
                         capture_output=True, text=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, timeout=300)
    assert res.returncode == 2 and "needs a CUDA GPU" in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert not out.exists()
