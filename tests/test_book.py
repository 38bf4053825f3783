"""The whole book builds strictly (warnings are errors), every notebook executed, on this machine."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import kernelbook as kb
from kernelbook.harness.paths import ROOT

_BUILT: dict[str, tuple] = {}  # one build of each kind per test session, shared with test_site.py

# The book must build wherever Python runs: without the CUDA toolkit and with PyTorch's CPU wheel. That build
# runs from its own environment, made once beside the repository (git-ignored).
NO_TOOLKIT_VENV = ROOT / ".venv-no-toolkit"
CPU_TORCH = "2.13.0"  # a CPU-only wheel
_CUDA_ONLY = ("torch", "triton", "nvidia-", "cuda-")  # pins of constraints.txt that belong to the CUDA build


def no_toolkit_env() -> dict[str, str]:
    """This environment without the CUDA toolkit: no nvcc on PATH, no CUDA_HOME, the CPU-torch venv first."""
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH", "VIRTUAL_ENV")}
    dirs = [d for d in env.get("PATH", "").split(os.pathsep) if d and not (Path(d) / "nvcc").exists()]
    env["PATH"] = os.pathsep.join([str(NO_TOOLKIT_VENV / "bin"), *dirs])
    return env


def no_toolkit_python() -> Path:
    """The CPU-PyTorch environment's python, made (once) from requirements.txt with torch==CPU_TORCH."""
    py = NO_TOOLKIT_VENV / "bin" / "python"
    probe = [str(py), "-c", "import torch, kernelbook; assert torch.version.cuda is None; print(torch.__version__)"]
    if py.exists() and subprocess.run(probe, capture_output=True, text=True).stdout.strip().startswith(CPU_TORCH):
        return py
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(NO_TOOLKIT_VENV)], check=True)
    pins = [line for line in (ROOT / "constraints.txt").read_text().splitlines() if not line.startswith(_CUDA_ONLY)]
    cons = NO_TOOLKIT_VENV / "constraints-no-toolkit.txt"
    cons.write_text("\n".join(pins) + "\n")
    subprocess.run([str(py), "-m", "pip", "install", "-q", f"torch=={CPU_TORCH}", "-r", "requirements.txt", "-c",
                    str(cons)], cwd=ROOT, check=True, timeout=1800, env=no_toolkit_env())
    out = subprocess.run(probe, capture_output=True, text=True, env=no_toolkit_env())
    assert out.returncode == 0 and out.stdout.startswith(CPU_TORCH), f"the CPU-torch environment is broken:\n{out}"
    return py


def build_site(tmp_path_factory, kind: str = "toolkit") -> Path:
    """Build the book once per session and kind (strictly: warnings are errors); return its html folder.

    ``toolkit``: this environment (CUDA PyTorch, nvcc on PATH). ``no-toolkit``: Python alone — PyTorch's CPU
    wheel and no nvcc — where the compiler's reports come from their records.
    """
    if kind not in _BUILT:
        out = tmp_path_factory.mktemp(f"book-{kind}")
        if kind == "toolkit":
            exe, env = shutil.which("jupyter-book") or str(Path(sys.executable).with_name("jupyter-book")), None
        else:
            exe, env = str(no_toolkit_python().with_name("jupyter-book")), no_toolkit_env()
            assert shutil.which("nvcc", path=env["PATH"]) is None
        res = subprocess.run([exe, "build", "-W", "-n", "--keep-going", "--path-output", str(out), "book/"],
                             cwd=ROOT, capture_output=True, text=True, timeout=2400, env=env)
        _BUILT[kind] = (res.returncode, f"{res.stdout[-6000:]}\n{res.stderr[-3000:]}", out / "_build" / "html")
    code, log, html = _BUILT[kind]
    assert code == 0, f"book build ({kind}) failed:\n{log}"
    return html


@pytest.fixture(scope="module", params=["toolkit", "no-toolkit"])
def site(request, tmp_path_factory) -> Path:
    return build_site(tmp_path_factory, request.param)


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
    html = (site / "notebooks" / "00_method.html").read_text().replace("<wbr>", "")  # header breaks
    if kb.gpu() is None:  # with a GPU the chapter runs live and shows no note
        assert "Recorded GPU results" in html and "H200" in html
    assert "scale_vec4_kernel" in html and "spill store bytes" in html  # the resource report
    if "no-toolkit" in str(site):
        assert "Recorded compiler report" in html, "without nvcc the resource report must say it was recorded"
    assert "{glue" not in html, "a glue reference was left unresolved"
