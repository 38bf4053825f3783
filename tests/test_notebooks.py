"""Notebook format: stored without outputs, one kernel spec, the chapter skeleton, prose glue defined."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from kernelbook.harness.paths import NOTEBOOKS, ROOT

CHAPTERS = sorted(NOTEBOOKS.glob("*.ipynb"))
SKELETON = ["Question", "Setup", "Idea", "Kernel", "Check", "Measure", "Profile", "Takeaways", "Exercises"]
GLUE_USE = re.compile(r"\{glue(?::\w+)?\}`([A-Za-z_][A-Za-z0-9_]*)")
GLUE_DEF = re.compile(r"""\bglue(?:_md)?\(\s*["']([A-Za-z_][A-Za-z0-9_]*)["']""")
GLUE_ALL = re.compile(r"glue_all\(\{(.*?)\}\)", re.DOTALL)  # kb.glue_all({"name": value, ...})
DICT_KEY = re.compile(r"""["']([A-Za-z_][A-Za-z0-9_]*)["']\s*:""")
GLUE_DYNAMIC = re.compile(r"\bglue(?:_all)?\(\s*[A-Za-z_]")  # kb.glue(name, ...) with a name from a variable
GLUE_PREFIX = re.compile(r"""\bglue\(\s*f["']([A-Za-z_][A-Za-z0-9_]*)\{""")  # kb.glue(f"ms_{k}", ...) in a loop
CODE_WIDTH = 88  # characters of code the rendered page's text column shows without scrolling
CELL_LINES = 40
BOOK_CODE_LINES = 3000  # nine chapters together: the idea, the call, the check, the result; plumbing elsewhere


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
def test_every_cell_has_a_unique_id(path):
    """nbformat 4.5 requires cell ids: a cell without one makes the executor warn, and warnings fail the build."""
    ids = [cell.get("id") for cell in _nb(path)["cells"]]
    assert None not in ids and len(set(ids)) == len(ids), f"{path.name}: cells without an id or with a repeated one"


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
    code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    defined = {m for src in code for m in GLUE_DEF.findall(src)}
    defined |= {m for src in code for block in GLUE_ALL.findall(src) for m in DICT_KEY.findall(block)}
    prefixes = tuple({m for src in code for m in GLUE_PREFIX.findall(src)})
    used = {u for u in used if not (prefixes and u.startswith(prefixes))}
    if any(GLUE_DYNAMIC.search(src) for src in code):
        pytest.skip(f"{path.name} glues names computed at run time: the strict build checks them (a missing "
                    "glue key is a warning, and warnings fail it)")
    assert used <= defined, f"{path.name}: prose uses glue names no cell computes: {sorted(used - defined)}"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_exercise_solutions_are_hidden_under_a_solution_dropdown(path):
    cells = _nb(path)["cells"]
    sols = [c for c in cells if c["cell_type"] == "code" and "".join(c["source"]).startswith("# Solution")]
    assert len(sols) >= 2, f"{path.name} has fewer than two exercise solutions"
    for c in sols:
        assert "hide-cell" in c["metadata"].get("tags", []), f"{path.name}: a solution shown open"
        assert c["metadata"].get("mystnb", {}).get("code_prompt_show") == "Solution", (
            f"{path.name}: a solution's dropdown is not labelled 'Solution'")


def _code(path) -> list[list[str]]:
    return ["".join(c["source"]).splitlines() for c in _nb(path)["cells"] if c["cell_type"] == "code"]


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_code_fits_the_page(path):
    """Code lines fit the text column and a cell fits a screen: nothing scrolls sideways."""
    wide = [line for cell in _code(path) for line in cell if len(line) > CODE_WIDTH]
    assert not wide, f"{path.name}: {len(wide)} code lines over {CODE_WIDTH} characters, e.g. {wide[0]!r}"
    long = [len(cell) for cell in _code(path) if len(cell) > CELL_LINES]
    assert not long, f"{path.name}: code cells of {long} lines (at most {CELL_LINES})"


def test_the_book_shows_ideas_not_plumbing():
    total = {p.stem: sum(len(c) for c in _code(p)) for p in CHAPTERS}
    assert sum(total.values()) <= BOOK_CODE_LINES, f"{sum(total.values())} lines of notebook code: {total}"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_bookkeeping_is_out_of_sight(path):
    """The record is saved by a cell the reader never sees; tables go through kb.show.table."""
    for c in _nb(path)["cells"]:
        src = "".join(c["source"])
        if c["cell_type"] != "code":
            continue
        if "kb.records.save(" in src:
            assert "remove-cell" in c["metadata"].get("tags", []), f"{path.name}: the record-saving cell shows"
        assert ".style.format" not in src and "show_source(" not in src, f"{path.name}: raw pandas or source dump"


def test_toc_lists_every_chapter_and_nothing_missing():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = set(_toc_files([toc] + toc.get("parts", [])))
    for p in CHAPTERS:
        assert f"notebooks/{p.stem}" in files, f"{p.name} is not in _toc.yml"
    for f in files:
        assert (ROOT / "book" / f).with_suffix(".ipynb").exists() or (ROOT / "book" / f"{f}.md").exists(), f
