"""Notebook format: stored without outputs, one kernel spec, the chapter skeleton, prose glue defined."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from kernelbook.paths import NOTEBOOKS, ROOT

CHAPTERS = sorted(NOTEBOOKS.glob("*.ipynb"))
SKELETON = ["Question", "Setup", "Idea", "Kernel", "Check", "Measure", "Profile", "Takeaways", "Exercises"]
GLUE_USE = re.compile(r"\{glue(?::\w+)?\}`([A-Za-z_][A-Za-z0-9_]*)")
GLUE_DEF = re.compile(r"""\bglue\(\s*["']([A-Za-z_][A-Za-z0-9_]*)["']""")


def _nb(path):
    return json.loads(path.read_text())


def _toc_files(entries):
    for e in entries:
        if "file" in e:
            yield e["file"]
        yield from _toc_files(e.get("chapters", []) + e.get("sections", []) + e.get("parts", []))


def test_there_are_chapters():
    assert CHAPTERS


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_stored_without_outputs(path):
    for i, cell in enumerate(_nb(path)["cells"]):
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None, f"{path.name} cell {i} has outputs"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_python3_kernelspec(path):
    assert _nb(path)["metadata"]["kernelspec"]["name"] == "python3"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_skeleton_in_order(path):
    heads = [ln[3:].strip() for c in _nb(path)["cells"] if c["cell_type"] == "markdown"
             for ln in "".join(c["source"]).splitlines() if ln.startswith("## ")]
    found = [next((h for h in heads if h.startswith(s)), None) for s in SKELETON]
    missing = [s for s, f in zip(SKELETON, found, strict=True) if f is None]
    assert not missing, f"{path.name} lacks sections {missing}"
    assert [heads.index(f) for f in found] == sorted(heads.index(f) for f in found), f"{path.name}: order"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_every_glued_name_in_prose_is_computed(path):
    cells = _nb(path)["cells"]
    used = {m for c in cells if c["cell_type"] == "markdown" for m in GLUE_USE.findall("".join(c["source"]))}
    defined = {m for c in cells if c["cell_type"] == "code" for m in GLUE_DEF.findall("".join(c["source"]))}
    assert used <= defined, f"{path.name}: prose uses glue names no cell computes: {sorted(used - defined)}"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_exercise_solutions_are_hidden(path):
    cells = _nb(path)["cells"]
    sols = [c for c in cells if c["cell_type"] == "code" and "".join(c["source"]).startswith("# Solution")]
    assert len(sols) >= 2, f"{path.name} has fewer than two exercise solutions"
    assert all("hide-cell" in c["metadata"].get("tags", []) for c in sols)


def test_toc_lists_every_chapter_and_nothing_missing():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = set(_toc_files([toc] + toc.get("parts", [])))
    for p in CHAPTERS:
        assert f"notebooks/{p.stem}" in files, f"{p.name} is not in _toc.yml"
    for f in files:
        assert (ROOT / "book" / f).with_suffix(".ipynb").exists() or (ROOT / "book" / f"{f}.md").exists(), f
