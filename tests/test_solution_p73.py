"""solutions/73_Conv2d_BatchNorm_Scaling.py: generated from kernels/, and passing KernelBench's kind of check.

KernelBench builds the reference Model and ModelNew under the same seed, then runs 5 trials with fresh
seeded ``torch.rand`` inputs, reusing both modules (in training mode: never .eval()) under no_grad, and
compares with ``torch.allclose(atol=1e-2, rtol=1e-2)``. We reproduce that, and check against float64 on top.
"""

from __future__ import annotations

import copy
import importlib.util
import subprocess
import sys
from functools import cache

import pytest
import torch

import kernelbook as kb
from kernelbook import check
from kernelbook.harness.paths import ROOT

SOLUTION = ROOT / "solutions" / "73_Conv2d_BatchNorm_Scaling.py"
GENERATOR = ROOT / "scripts" / "make_solutions.py"
PROBLEM = kb.problems.P73_CONV_BN_SCALE


@cache
def solution():
    spec = importlib.util.spec_from_file_location("solution_p73", SOLUTION)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_committed_solution_is_generated_from_kernels():
    res = subprocess.run([sys.executable, str(GENERATOR), "--check"], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_solution_has_the_submission_form():
    sol = solution()
    torch.manual_seed(0)
    ours = sol.ModelNew(*PROBLEM.init_args)
    ref = PROBLEM.model(seed=0)
    assert ours.training and ref.training
    assert list(ours.state_dict()) == list(ref.state_dict())
    for k, v in ref.state_dict().items():
        assert torch.equal(ours.state_dict()[k], v), f"{k} differs under the same seed"
    assert "load_inline" in SOLUTION.read_text() and "import kernelbook" not in SOLUTION.read_text()


def _kernelbench_check(batch: int | None, trials: int = 5) -> None:
    sol = solution()
    torch.manual_seed(42)
    ref = PROBLEM.module(*PROBLEM.init_args).cuda()
    torch.manual_seed(42)
    ours = sol.ModelNew(*PROBLEM.init_args).cuda()
    shape = (batch or PROBLEM.input_shape[0], *PROBLEM.input_shape[1:])
    with torch.no_grad():
        for trial in range(trials):
            torch.manual_seed(trial)
            x = torch.rand(shape, device="cuda")
            out_ref, out = ref(x), ours(x)
            assert out.shape == out_ref.shape
            assert torch.allclose(out, out_ref, atol=1e-2, rtol=1e-2), (
                f"trial {trial}: max abs difference {float((out - out_ref).abs().max()):.3e}")
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        assert torch.allclose(getattr(ours.bn, name).double(), getattr(ref.bn, name).double(), atol=1e-2,
                              rtol=1e-2), name


@pytest.mark.gpu
def test_kernelbench_style_check_on_the_benchmark_shape():
    _kernelbench_check(batch=None)


@pytest.mark.gpu
@pytest.mark.parametrize("momentum", [0.1, None])
def test_solution_matches_float64_in_train_and_eval(momentum):
    sol = solution()
    torch.manual_seed(3)
    ours = sol.ModelNew(*PROBLEM.init_args).cuda()
    ours.bn.momentum = momentum
    with torch.no_grad():
        ours.bn.weight.uniform_(-1.5, 2.0)
        ours.bn.bias.uniform_(-1, 1)
    ref = copy.deepcopy(PROBLEM.module(*PROBLEM.init_args)).cuda().double()
    ref.load_state_dict(ours.state_dict())
    ref.bn.momentum = momentum
    with torch.no_grad():
        for step in range(3):
            x = PROBLEM.inputs(seed=step, batch=16, device="cuda")
            check.assert_close(ours(x), ref(x.double()), 1e-5, what=f"train step {step}")
            for name in ("running_mean", "running_var"):
                check.assert_close(getattr(ours.bn, name), getattr(ref.bn, name), 1e-5, what=name)
            assert int(ours.bn.num_batches_tracked) == int(ref.bn.num_batches_tracked) == step + 1
        ours.eval()
        ref.eval()
        x = PROBLEM.inputs(seed=9, batch=16, device="cuda")
        check.assert_close(ours(x), ref(x.double()), 1e-5, what="eval")
