import shutil
import subprocess
import sys
from pathlib import Path

from kernelbook.paths import ROOT


def test_ruff_is_clean():
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    assert Path(ruff).exists(), "ruff is not installed (pip install -r requirements-dev.txt)"
    res = subprocess.run([ruff, "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
