"""The record format, the no-GPU path, and the staleness check that keeps old numbers out of the book."""

from __future__ import annotations

import json
import shutil

import pytest

from kernelbook import build, records
from kernelbook.harness.paths import KERNELS, RESULTS

REQUIRED_PROVENANCE = {"gpu", "capability", "driver", "cuda", "torch", "date", "commit", "kernels"}
RECORDS = records.all_records()


def _fake_record(chapter: str, kernels_root) -> dict:
    return {
        "chapter": chapter,
        "provenance": {"gpu": "NVIDIA H200", "capability": "9.0", "driver": "580", "cuda": "13.0",
                       "torch": "2.11.0", "date": "2026-11-29", "commit": "abc",
                       "kernels": build.source_hashes("scale", kernels_root)},
        "checks": {"c": {"rel_err": 0.0, "max_abs_err": 0.0, "tol": 1e-7, "unwritten": 0, "passed": True}},
        "timings_ms": {"ours": {"median": 1.0, "q20": 0.9, "q80": 1.1}},
        "live": True,
    }


def test_recorded_results_exist():
    assert RECORDS, "results/ holds no records"


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_record_format(path):
    rec = json.loads(path.read_text())
    assert rec["chapter"] == path.stem
    assert REQUIRED_PROVENANCE <= rec["provenance"].keys()
    assert rec["provenance"]["kernels"], "a record must name the kernel sources it measured"
    for name, c in rec["checks"].items():
        assert {"rel_err", "max_abs_err", "tol", "passed"} <= c.keys(), name
        assert c["passed"], f"{path.stem}: recorded check {name!r} failed"
    for variant, t in rec["timings_ms"].items():
        assert t["q20"] <= t["median"] <= t["q80"], variant


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_no_record_is_stale(path):
    rec = json.loads(path.read_text())
    changed = records.stale(rec)
    assert not changed, (f"{path} was recorded from kernel sources that have changed since: {changed}. "
                         f"Re-run the chapter on a GPU with KERNELBOOK_RECORD=1.")


def _scale_sources(tmp_path):
    """A kernels/ folder holding a copy of the scale kernel's sources, to change in a test."""
    kdir = tmp_path / "kernels"
    kdir.mkdir()
    for f in build.sources("scale"):
        shutil.copy(f, kdir / f.name)
    return kdir


def test_staleness_check_fails_when_a_kernel_changes(tmp_path):
    kdir = _scale_sources(tmp_path)
    rec = _fake_record("00_method", kdir)
    assert records.stale(rec, kdir) == []
    (kdir / "scale.cu").write_text((kdir / "scale.cu").read_text().replace("kUnroll = 4", "kUnroll = 2"))
    assert records.stale(rec, kdir) == ["kernels/scale.cu"]
    (kdir / "scale.cpp").unlink()
    assert records.stale(rec, kdir) == ["kernels/scale.cu", "kernels/scale.cpp"]


def test_capstone_records_hash_their_submissions():
    for chapter, problem in [("07_capstone_conv_bn_scale", "73_Conv2d_BatchNorm_Scaling"),
                             ("08_capstone_conv3d_groupnorm_mean", "27_Conv3d_HardSwish_GroupNorm_Mean")]:
        rec = records.load(chapter, "h200")
        rel = f"solutions/{problem}.py"
        assert rel in rec["provenance"]["kernels"], f"{chapter}'s record does not hash {rel}: re-record it"
        changed = dict(rec, provenance=dict(rec["provenance"], kernels={rel: "0" * 64}))
        assert records.stale(changed) == [rel]


def test_save_writes_only_when_asked(tmp_path, monkeypatch):
    rec = _fake_record("99_demo", KERNELS)
    monkeypatch.delenv("KERNELBOOK_RECORD", raising=False)
    assert records.save(rec, tmp_path) is None
    monkeypatch.setenv("KERNELBOOK_RECORD", "1")
    p = records.save(rec, tmp_path)
    assert p == tmp_path / "h200" / "99_demo.json"
    back = records.load("99_demo", "h200", tmp_path)
    assert back["live"] is False and back["timings_ms"] == rec["timings_ms"]
    assert records.save(back, tmp_path) is None  # a loaded record is never re-written


def test_missing_record_says_how_to_make_one(tmp_path):
    with pytest.raises(FileNotFoundError, match="KERNELBOOK_RECORD=1"):
        records.load("99_nothing", "h200", tmp_path)


def test_note_names_the_provenance():
    rec = _fake_record("00_method", KERNELS)
    note = records.note_html(rec)
    for word in ("NVIDIA H200", "9.0", "580", "2.11.0", "2026-11-29", "abc", "admonition"):
        assert word in note


COMPILER_RECORDS = sorted(build.COMPILER_RESULTS.glob("*.json"))


@pytest.mark.parametrize("path", COMPILER_RECORDS, ids=[p.stem for p in COMPILER_RECORDS])
def test_no_compiler_report_is_stale(path):
    """A build without nvcc shows these reports: they must describe today's kernel sources."""
    rec = json.loads(path.read_text())
    assert rec["provenance"]["kernels"] == build.source_hashes(rec["kernel"]), (
        f"kernels/{rec['kernel']} changed after its compiler reports were recorded: run its chapter where nvcc "
        f"is installed with KERNELBOOK_RECORD_COMPILER=1 (scripts/run_notebooks.py --record-compiler)")


def test_gpu_evidence_covers_todays_kernels_and_is_clean():
    """The GPU tests and all four compute-sanitizer tools passed on exactly today's kernel sources."""
    from kernelbook.harness.paths import RESULTS

    path = RESULTS / records.DEFAULT_GPU / f"{records.EVIDENCE}.json"
    assert path.is_file(), f"{path} is missing: run scripts/gpu_session.sh on the GPU"
    ev = json.loads(path.read_text())
    assert records.made_on(ev, records.DEFAULT_GPU)
    now = {f"kernels/{p.name}": build.file_sha256(p) for p in sorted(KERNELS.iterdir()) if p.is_file()}
    changed = sorted(k for k in now.keys() | ev["provenance"]["kernels"].keys()
                     if now.get(k) != ev["provenance"]["kernels"].get(k))
    assert not changed, f"kernel sources changed since the GPU tests and compute-sanitizer last passed: {changed}"
    t = ev["tests"]
    assert t["passed"] > 0 and t["failed"] == 0 and t["errors"] == 0, t
    assert set(ev["sanitizer"]) == {"memcheck", "racecheck", "initcheck", "synccheck"}, ev["sanitizer"].keys()
    for tool, s in ev["sanitizer"].items():
        assert s["exit_code"] == 0 and s["errors"] == 0 and s["workloads"], (tool, s)


SPREADS = sorted(RESULTS.glob(f"*/{records.SPREAD}.json"))  # results/<gpu>/spread.json


def test_a_spread_file_is_not_a_chapter_record(tmp_path):
    rec = _fake_record("00_method", KERNELS)
    records.append_run({"pid": 1, "provenance": rec["provenance"], "timings_ms": {}},
                       records.spread_path("h200", tmp_path))
    (tmp_path / "h200" / "00_method.json").write_text(json.dumps(rec))
    assert [p.stem for p in records.all_records(tmp_path)] == ["00_method"]


@pytest.mark.parametrize("path", SPREADS, ids=lambda p: p.parent.name)
def test_spread_runs_are_well_formed(path):
    """Each run: a chapter record's provenance, made on its folder's GPU, timings of declared variants.
    A run made before a chapter's kernels changed is not a failure: the intro drops that chapter's ranges
    (``records.fresh_for``) and says so under its table."""
    declared = {r["chapter"]: r.get("variants", {}) for r in records.on_gpu(path.parent.name)}
    for run in records.spread_runs(path):
        assert REQUIRED_PROVENANCE <= run["provenance"].keys() and records.made_on(run, path.parent.name)
        for key, t in run["timings_ms"].items():
            chapter, _, variant = key.partition("/")
            assert variant in declared.get(chapter, {}), f"{path}: {key} is no declared variant"
            assert t["q20"] <= t["median"] <= t["q80"], key


def test_a_spread_run_is_fresh_for_a_chapter_only_while_its_kernels_are_unchanged(tmp_path):
    kdir = _scale_sources(tmp_path)
    rec = _fake_record("00_method", kdir)
    run = {"provenance": {"kernels": dict(rec["provenance"]["kernels"])}}
    assert records.fresh_for(run, rec, kdir)
    (kdir / "scale.cu").write_text((kdir / "scale.cu").read_text() + "\n// changed\n")
    assert not records.fresh_for(run, rec, kdir)
    assert not records.fresh_for({"provenance": {"kernels": {}}}, _fake_record("00_method", KERNELS))  # not hashed
