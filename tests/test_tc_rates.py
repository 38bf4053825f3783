"""math="auto" picks the tensor cores by the GPU's rates (kernels/tc_rates.h), not by its major version."""

import shutil
import subprocess

import pytest

from kernelbook.harness.paths import ROOT

# (major, minor): does 3xTF32 pay? From the header's datasheet table: dense TF32 at least 3.5× FP32.
EXPECTED = {(7, 0): False, (7, 5): False, (8, 0): True, (8, 6): False, (8, 7): False, (8, 9): False,
            (9, 0): True, (10, 0): True, (10, 3): True, (12, 0): False, (11, 0): False}

PROGRAM = """#include <cstdio>
#include "tc_rates.h"
int main() {
    const int cc[][2] = {%s};
    for (const auto& c : cc) std::printf("%%d %%d %%d %%.1f\\n", c[0], c[1], kb_3xtf32_pays(c[0], c[1]) ? 1 : 0,
                                         kb_tf32_over_fp32(c[0], c[1]));
}
"""


@pytest.fixture(scope="module")
def decisions(tmp_path_factory) -> dict:
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("needs a C++ compiler (g++)")
    d = tmp_path_factory.mktemp("tc_rates")
    (d / "main.cpp").write_text(PROGRAM % ", ".join(f"{{{a}, {b}}}" for a, b in EXPECTED))
    subprocess.run([cxx, "-std=c++17", "-I", str(ROOT / "kernels"), str(d / "main.cpp"), "-o", str(d / "main")],
                   check=True)
    out = subprocess.run([str(d / "main")], check=True, capture_output=True, text=True).stdout.split("\n")
    return {(int(a), int(b)): (c == "1", float(r)) for a, b, c, r in (line.split() for line in out if line)}


@pytest.mark.parametrize("cc", list(EXPECTED), ids=lambda cc: f"sm_{cc[0]}{cc[1]}")
def test_auto_takes_the_tensor_cores_only_where_they_pay(decisions, cc):
    pays, ratio = decisions[cc]
    assert pays == EXPECTED[cc], f"sm_{cc[0]}{cc[1]}: TF32/FP32 ≈ {ratio}"
    assert pays == (ratio >= 3.5)


def test_the_binding_asks_the_table():
    src = (ROOT / "kernels" / "conv_bn_scale.cpp").read_text()
    assert '#include "tc_rates.h"' in src and "kb_3xtf32_pays(major, minor)" in src
