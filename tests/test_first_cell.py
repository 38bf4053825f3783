"""Every chapter opens with the one canonical self-sufficiency cell (scripts/first_cell.py), which is a
no-op where the toolkit is installed, and otherwise finds or clones the repository."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import yaml

from kernelbook.harness.paths import NOTEBOOKS, ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import first_cell  # noqa: E402

CHAPTERS = first_cell.chapters()


def test_the_repository_address_is_written_once():
    cfg = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert first_cell.repo_url() == cfg["repository"]["url"] == cfg["parse"]["myst_substitutions"]["repo_url"]
    assert f'REPO_URL = "{cfg["repository"]["url"]}"' in first_cell.text()


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_first_code_cell_is_the_canonical_one(path):
    cell = first_cell.first_code_cell(json.loads(path.read_text()))
    assert cell is not None and "".join(cell["source"]) == first_cell.text(), (
        f"{path.name}: the first code cell is not scripts/first_cell.py's cell — run `python scripts/first_cell.py`")
    assert cell["metadata"].get("tags") == first_cell.TAGS


def test_apply_is_idempotent_and_touches_only_the_first_cell(tmp_path):
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "_config.yml").write_text((ROOT / "_config.yml").read_text())
    src = NOTEBOOKS / "00_method.ipynb"
    dst = tmp_path / "notebooks" / src.name
    dst.write_text(src.read_text())
    first_cell.apply(dst, "# Self-sufficiency: an older version\npass")
    assert first_cell.apply(dst, first_cell.text(tmp_path)) is True
    assert first_cell.apply(dst, first_cell.text(tmp_path)) is False
    assert first_cell.stale(tmp_path) == []
    before = [c for c in json.loads(src.read_text())["cells"] if not "".join(c["source"]).startswith(first_cell.MARKER)]
    after = [c for c in json.loads(dst.read_text())["cells"] if not "".join(c["source"]).startswith(first_cell.MARKER)]
    assert before == after


def _run_cell(cwd, fake_missing: bool) -> dict:
    """Execute the cell in a fresh interpreter; subprocess.run is recorded, never run (no pip, no git)."""
    prelude = textwrap.dedent(f"""
        import importlib.util, json, os, subprocess, sys
        calls = []
        real = importlib.util.find_spec
        if {fake_missing!r}:
            importlib.util.find_spec = lambda name, *a: None if name == "kernelbook" else real(name, *a)
        def fake_run(cmd, **kw):
            calls.append(cmd)
            if cmd[:2] == ["git", "clone"]:
                os.makedirs(os.path.join(cmd[-1], "notebooks"))
        subprocess.run = fake_run
        start = os.getcwd()
    """)
    after = "\nprint(json.dumps({'calls': calls, 'cwd': os.getcwd(), 'path0': sys.path[0], 'start': start}))\n"
    res = subprocess.run([sys.executable, "-c", prelude + first_cell.text() + after], cwd=cwd,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_cell_is_a_no_op_where_the_toolkit_is_installed(tmp_path):
    out = _run_cell(tmp_path, fake_missing=False)
    assert out["calls"] == [] and out["cwd"] == out["start"]


def test_cell_finds_the_repository_above_the_notebook():
    out = _run_cell(NOTEBOOKS, fake_missing=True)
    assert out["calls"] == [], "everything is installed here: nothing to clone or pip-install"
    assert out["path0"] == str(ROOT) and out["cwd"] == str(NOTEBOOKS)


def test_cell_clones_the_repository_when_opened_alone(tmp_path):
    out = _run_cell(tmp_path, fake_missing=True)
    assert out["calls"][0][:2] == ["git", "clone"] and first_cell.repo_url() in out["calls"][0]
    assert out["cwd"].startswith(str(tmp_path)) and out["cwd"].endswith("notebooks")
