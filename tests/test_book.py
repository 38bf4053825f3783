"""The whole book builds strictly (warnings are errors), every notebook executed, on this machine."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import kernelbook as kb
from kernelbook.paths import ROOT

_BUILT: dict[str, object] = {}  # one build per test session, shared with test_site.py


def build_site(tmp_path_factory) -> Path:
    """Build the book once per session (strictly: warnings are errors) and return its html folder."""
    if "result" not in _BUILT:
        out = tmp_path_factory.mktemp("book")
        exe = shutil.which("jupyter-book") or str(Path(sys.executable).with_name("jupyter-book"))
        res = subprocess.run([exe, "build", "-W", "-n", "--keep-going", "--path-output", str(out), "book/"],
                             cwd=ROOT, capture_output=True, text=True, timeout=1800)
        _BUILT["result"] = (res.returncode, f"{res.stdout[-6000:]}\n{res.stderr[-3000:]}", out / "_build" / "html")
    code, log, html = _BUILT["result"]
    assert code == 0, f"book build failed:\n{log}"
    return html


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    return build_site(tmp_path_factory)


@pytest.mark.book
def test_book_builds_with_every_page(site):
    for page in ["intro.html", "reproducing.html", "profiling.html", "pitfalls.html", "references.html",
                 "notebooks/00_method.html", "notebooks/01_bn_modes.html"]:
        assert (site / page).is_file(), page


@pytest.mark.book
def test_no_cell_failed_or_warned(site):
    for page in site.rglob("*.html"):
        text = page.read_text()
        assert "Traceback (most recent call last)" not in text, page
        assert 'class="output stderr"' not in text, f"{page.name} shows stderr output"
        assert "{glue" not in text, f"{page.name} has an unresolved glue reference"


@pytest.mark.book
def test_method_chapter_shows_recorded_results_and_resources(site):
    html = (site / "notebooks" / "00_method.html").read_text()
    if kb.gpu() is None:  # with a GPU the chapter runs live and shows no note
        assert "Recorded GPU results" in html and "H200" in html
    assert "scale_vec4_kernel" in html and "spill_store_bytes" in html
    assert "{glue" not in html, "a glue reference was left unresolved"
