"""Eval mode's guarded default on P73's benchmark input, kernel by kernel (torch.profiler, 20 calls after warm-up):
the wgmma convolution with the guard's sums, eval_guard_kernel, the gated FFMA launch and the workspace's memset.

    python3 dev/guard_probe.py        → one JSON line: mean µs per call of each kernel
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import kernelbook as kb  # noqa: E402

p = kb.problems.P73_CONV_BN_SCALE
x, ref = p.inputs(seed=0).cuda(), p.model(seed=0).cuda()
ext = kb.build.load("conv_bn_scale")
w, b = ref.conv.weight.detach(), ref.conv.bias.detach()
assert ext.conv_bn_scale_math(x, "auto", "eval") == "guarded", ext.conv_bn_scale_math(x, "auto", "eval")
calls = 20
with torch.no_grad():
    for _ in range(3):
        ext.conv_bn_scale_eval(x, w, b, None, "auto")
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            ext.conv_bn_scale_eval(x, w, b, None, "auto")
        torch.cuda.synchronize()
us = {e.key[:60]: round(e.device_time_total / calls, 2) for e in prof.key_averages() if e.device_time_total > 0}
print(json.dumps({"gpu": torch.cuda.get_device_name(), "us_per_call": us}))
