"""P73's training-mode default, called three times on the benchmark's input, for Nsight Compute (the moments' kernels).

    ncu -k regex:moments -c 4 python3 dev/moments_probe.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import kernelbook as kb  # noqa: E402
from kernelbook.models.training import FusedP73  # noqa: E402

p = kb.problems.P73_CONV_BN_SCALE
x, ref = p.inputs(seed=0).cuda(), p.model(seed=0).cuda()
fused = FusedP73(kb.build.load("conv_bn_scale"), ref)
with torch.no_grad():
    for _ in range(3):
        fused(x)
torch.cuda.synchronize()
print("ok")
