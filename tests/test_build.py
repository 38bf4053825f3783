"""The build toolkit, and every kernel of the book compiled: torch-free .cu with nvcc for three
architectures, and the whole extension (binding included) through load_inline."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from kernelbook import build
from kernelbook.harness.paths import KERNELS

KERNEL_NAMES = sorted(p.stem for p in KERNELS.glob("*.cu"))
ARCHS = ["75", "80", "90"]

SAMPLE = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z1tILi4EEvPf' for 'sm_90'
ptxas info    : Function properties for _Z1tILi4EEvPf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 0 barriers
ptxas info    : Function properties for _ZN12_GLOBAL__N_16kernelEPKfPfi
    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 1024 bytes smem, 380 bytes cmem[0]
"""


def test_every_kernel_has_a_binding():
    assert KERNEL_NAMES, "no kernels found"
    for name in KERNEL_NAMES:
        assert (KERNELS / f"{name}.cpp").is_file(), f"kernels/{name}.cu has no kernels/{name}.cpp binding"


def test_cu_files_are_torch_free_and_launches_are_in_cu():
    for name in KERNEL_NAMES:
        cu = (KERNELS / f"{name}.cu").read_text()
        cpp = (KERNELS / f"{name}.cpp").read_text()
        assert "torch/" not in cu and "ATen/" not in cu, f"{name}.cu includes torch headers"
        assert "<<<" not in cpp, f"{name}.cpp launches a kernel: host launch code belongs in the .cu"
        assert "getCurrentCUDAStream" in cpp, f"{name}.cpp must launch on PyTorch's current stream"


def test_parse_resource_usage():
    rows = build.parse_resource_usage(SAMPLE)
    assert [r["kernel"] for r in rows] == ["t<4>", "kernel"]
    assert rows[0]["registers"] == 10 and rows[0]["smem_bytes"] == 0
    assert rows[1]["registers"] == 255 and rows[1]["smem_bytes"] == 1024
    assert (rows[1]["stack_bytes"], rows[1]["spill_store_bytes"], rows[1]["spill_load_bytes"]) == (16, 8, 4)


@pytest.mark.parametrize("demangled, short", [
    ("void (anonymous namespace)::bn_apply_kernel<4, true>((anonymous namespace)::Params)", "bn_apply_kernel<4, 1>"),
    ("void <unnamed>::bn_apply_kernel<(int)4, (bool)1>(<unnamed>::Params)", "bn_apply_kernel<4, 1>"),
    ("(anonymous namespace)::scale_vec4_kernel(float const*, float*, float, long)", "scale_vec4_kernel"),
    ("void t<4>(float*)", "t<4>"),
])
def test_kernel_names_agree_between_demanglers(demangled, short):
    assert build.short_name(demangled) == short


def test_bindings_build_messages_from_strings():
    """TORCH_CHECK with non-string arguments crashed a torch 2.11 process (see kernels/torch_checks.h)."""
    for cpp in KERNELS.glob("*.cpp"):
        assert "TORCH_CHECK(" not in cpp.read_text(), f"{cpp.name}: use KB_CHECK, not TORCH_CHECK"


def test_module_name_depends_on_sources_and_arch(tmp_path, monkeypatch):
    for f in build.sources("scale"):
        shutil.copy(f, tmp_path / f.name)
    monkeypatch.setattr(build, "KERNELS", tmp_path)
    a90, a80 = build.module_name("scale", "90"), build.module_name("scale", "80")
    assert a90 != a80 and a90.startswith("kb_scale_") and a90.endswith("_sm90")
    assert build.module_name("scale", "90") == a90  # deterministic
    assert build.module_name("scale", "90", {"X": 1}) not in (a90, build.module_name("scale", "90", {"X": 2}))
    assert "-DX=1" in build.plan("scale", "90", {"X": 1})["nvcc_flags"]
    (tmp_path / "scale.cu").write_text((tmp_path / "scale.cu").read_text() + "\n// changed\n")
    assert build.module_name("scale", "90") != a90


def test_sources_follow_local_includes(tmp_path):
    (tmp_path / "k.cu").write_text('#include "a.cuh"\n#include <cuda_runtime.h>\n')
    (tmp_path / "k.cpp").write_text("// binding\n")
    (tmp_path / "a.cuh").write_text('#include "b.cuh"\n')
    (tmp_path / "b.cuh").write_text("// leaf\n")
    assert [p.name for p in build.sources("k", tmp_path)] == ["k.cu", "k.cpp", "a.cuh", "b.cuh"]
    with pytest.raises(FileNotFoundError, match="kernels/missing.cu"):
        build.sources("missing", tmp_path)


def test_plan_builds_outside_the_repo():
    p = build.plan("scale", "90")
    assert not str(p["build_dir"]).startswith(str(KERNELS.parent))
    assert "-gencode=arch=compute_90,code=sm_90" in p["nvcc_flags"]
    assert not any("fast_math" in f for f in p["nvcc_flags"])


def test_hopper_only_kernels_build_for_sm90a_on_sm90():
    assert build.uses_sm90a("gemm_wgmma") and not build.uses_sm90a("scale")
    assert "-gencode=arch=compute_90a,code=sm_90a" in build.plan("gemm_wgmma", "90")["nvcc_flags"]
    assert "-gencode=arch=compute_80,code=sm_80" in build.plan("gemm_wgmma", "80")["nvcc_flags"]
    assert build.module_name("gemm_wgmma", "90").endswith("_sm90")  # one module per GPU, whatever its target


@pytest.mark.compile
def test_sm90a_report_shows_hopper_instructions():
    rows = build.resources("gemm_wgmma", "90")
    assert {r["arch"] for r in rows} == {"sm_90a"}
    assert "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32" in build.ptx_instructions(
        "gemm_wgmma", "gemm_wgmma_kernel", "90")


@pytest.mark.compile
def test_cuda_home_is_the_toolkit_root():
    assert os.path.isfile(os.path.join(build.cuda_home(), "include", "cuda_runtime.h"))


# Kernels allowed a small spill, with the bytes they may spill at most: the 3xTF32 GEMM's versions 3-5
# hold 64 accumulators, both halves of their fragments and the next slab in 255 registers (chapter 6
# shows the report and times them as they are).
# CUTLASS's own kernels (the yardstick, built as the library builds them) keep an 8-byte stack frame on some
# targets (its convolution on sm_80; its sm_80 GEMM compiled for sm_75, where it does not run).
SPILL_ALLOWED = {("gemm_3xtf32", "gemm_tf32_v3_kernel<3"): 32, ("gemm_3xtf32", "gemm_tf32_v5_kernel<3>"): 16,
                 ("cutlass_conv", "cutlass"): 8, ("cutlass_gemm", "cutlass"): 8}


@pytest.mark.compile
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", KERNEL_NAMES)
def test_cu_compiles_without_spills(name, arch):
    rows = build.resources(name, arch)
    assert rows, f"{name}.cu has no kernels for sm_{arch}"
    for r in rows:
        allowed = max([b for (n, k), b in SPILL_ALLOWED.items() if n == name and k in r["kernel"]], default=0)
        spilled = max(r["spill_store_bytes"], r["spill_load_bytes"], r["stack_bytes"])
        assert spilled <= allowed, f"{r['kernel']} spills or uses a stack frame ({spilled} B) on sm_{arch}"


@pytest.fixture(scope="module")
def compiled():
    """Every extension compiled through load_inline for sm_90 (works without a GPU)."""
    return {name: build.load(name, arch="90") for name in KERNEL_NAMES}


@pytest.mark.compile
def test_every_extension_compiles_through_load_inline(compiled):
    for name, mod in compiled.items():
        assert mod.__name__ == build.module_name(name, "90")


@pytest.mark.compile
@pytest.mark.parametrize("make, message", [
    (lambda: torch.ones(8, dtype=torch.float64), "x must be float32, got float64"),
    (lambda: torch.ones(4, 2).t(), "x must be contiguous"),
    (lambda: torch.ones(8), "x must be a CUDA tensor, got a tensor on cpu"),
])
def test_scale_rejects_bad_input_by_name(compiled, make, message):
    with pytest.raises(RuntimeError, match=message):
        compiled["scale"].scale(make(), 2.0)
