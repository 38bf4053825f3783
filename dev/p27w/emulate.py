"""dev/p27w/conv3d_wgmma.cuh's index math, replayed on the CPU (numpy, float64) before the kernel ever runs.

    python dev/p27w/emulate.py        # a few shapes; prints the largest difference from numpy's convolution

Every address the kernel computes is recomputed here with the kernel's own formulas: the staged input's layout,
the filter's shared-memory layout (decoded from its flat index as the kernel decodes it), each lane's A fragment
(rows g, g + 8; k = tq, tq + 4 — the m16n8k8 A layout, per warp of the warpgroup), B read through a K-major
no-swizzle descriptor (element (n, k) at start + (n / 8)·SBO + (n % 8)·16 + (k / 4)·LBO + (k % 4)·4 bytes), the
accumulator's register layout (row g + 8·((i / 2) % 2), column 8·(i / 4) + 2·tq + (i % 2)) and the output's
index. The hi/lo split is left out (hi = x, lo = 0: the products are exact), so a wrong index shows as a difference
far above float64 rounding. What this cannot check: the hardware's own fragment and descriptor conventions, which
are the ones the landed conv_wgmma.cuh and the book's mma.sync kernels already use on the GPU.
"""

from __future__ import annotations

import numpy as np

KS, CI_MAX, CO, ROWS, PITCH = 4, 4, 16, 2, 36
IN_ROWS = ROWS + KS - 1
STEPS_PER_CI, STEP_FLOATS = KS * 2, 2 * 32 * 4


def conv3d_ref(x, w, b):
    n, ci, d, h, wd = x.shape
    co = w.shape[0]
    do, ho, wo = d - 3, h - 3, wd - 3
    y = np.zeros((n, co, do, ho, wo)) + b[None, :, None, None, None]
    for kd in range(4):
        for kh in range(4):
            for kw in range(4):
                patch = x[:, :, kd:kd + do, kh:kh + ho, kw:kw + wo]
                y += np.einsum("ncdhw,oc->nodhw", patch, w[:, :, kd, kh, kw])
    return y


def emulate(x, w, b, nd_max=3, version=3):
    """Version 4 reads each step's 32 rows as one N = 32 operand: its W_lo rows hold w again here (W_lo = 0 in
    version 3), and registers i + 8 (columns 16 + …) join registers i, so the result is conv(x, 2w) + b."""
    N, C_in, D, H, W = x.shape
    C_out = w.shape[0]
    DO, HO, WO = D - 3, H - 3, W - 3
    DD = nd_max + KS - 1
    f_s = np.zeros(CI_MAX * STEPS_PER_CI * STEP_FLOATS)
    for i in range(C_in * STEPS_PER_CI * STEP_FLOATS):  # the kernel's filter loop
        kw, n, half, h, kd, ci = i & 3, (i >> 2) & 31, (i >> 7) & 1, (i >> 8) & 1, (i >> 9) & 3, i >> 11
        c, kh = n & 15, 2 * h + half
        v = w[c, ci, kd, kh, kw] if c < C_out else 0.0
        f_s[i] = v if n < 16 or version >= 4 else 0.0  # W_lo: 0 (version 3) or w again (version 4)
    def b_elem(start_bytes, n, k, lbo=512, sbo=128):
        """Element (n, k) of B through the descriptor (byte addresses of the kernel's 4-byte floats)."""
        return f_s[(start_bytes + (n // 8) * sbo + (n % 8) * 16 + (k // 4) * lbo + (k % 4) * 4) // 4]

    for s_ in range(C_in * STEPS_PER_CI):  # W_lo's descriptor (256 bytes on) reads rows 16–31 of each step
        for n in range(16):
            for k in range(8):
                fb = s_ * STEP_FLOATS * 4
                assert b_elem(fb + 256, n, k) == f_s[s_ * STEP_FLOATS + (k // 4) * 128 + (n + 16) * 4 + k % 4]

    y = np.full((N, C_out, DO, HO, WO), np.nan)
    dgroups, rpairs = -(-DO // nd_max), -(-HO // ROWS)
    for u in range(N * dgroups * rpairs):
        oh0 = (u % rpairs) * ROWS
        od0 = (u // rpairs % dgroups) * nd_max
        bb = u // rpairs // dgroups
        nd = min(nd_max, DO - od0)
        items = C_in * DD * IN_ROWS * PITCH
        in_hi = np.zeros(items)
        for i in range(items):
            col, row, dd, ci = i % PITCH, i // PITCH % IN_ROWS, i // (PITCH * IN_ROWS) % DD, i // (PITCH * IN_ROWS * DD)
            idd, ih = od0 + dd, oh0 + row
            if idd < D and ih < H and col < W:
                in_hi[i] = x[bb, ci, idd, ih, col]
        for warp in range(4):
            for lane in range(32):
                g, tq = lane // 4, lane % 4
                r2, col0 = warp // 2, 16 * (warp % 2) + g
                hh = np.zeros((nd_max, 8))
                acc = np.array([[b[8 * (i // 4) + 2 * tq + (i & 1)] if 8 * (i // 4) + 2 * tq + (i & 1) < C_out else 0.0
                                 for i in range(8)] for _ in range(nd_max)])
                for ci in range(C_in):
                    for h in range(2):
                        for dd in range(DD):
                            for j in range(nd_max):
                                kd = dd - j
                                if kd < 0 or kd >= KS:
                                    continue
                                fb = (((ci * KS + kd) * 2 + h) * STEP_FLOATS) * 4
                                # the warpgroup's product, restricted to this lane's 8 accumulator registers
                                for i in range(8):
                                    row_in_warp = g + 8 * ((i // 2) % 2)
                                    ncol = 8 * (i // 4) + 2 * tq + (i % 2)
                                    s = 0.0
                                    for k in range(8):
                                        # A[row][k] as lane (row % 8, k % 4) of this warp loads it
                                        g2, t2 = row_in_warp % 8, k % 4
                                        base = (((ci * DD + dd) * IN_ROWS + r2 + 2 * h) * PITCH
                                                + 16 * (warp % 2) + g2 + t2)
                                        e = (row_in_warp // 8) + 2 * (k // 4)  # a0: (g, t), a1: (g+8, t), a2: (g, t+4)
                                        off = [0, 8, PITCH, PITCH + 8][e]
                                        s += in_hi[base + off] * b_elem(fb, ncol, k)
                                    if version >= 4:  # register i + 8 of the m64n32 accumulator: column 16 + ncol
                                        for k in range(8):
                                            g2, t2 = row_in_warp % 8, k % 4
                                            base = (((ci * DD + dd) * IN_ROWS + r2 + 2 * h) * PITCH
                                                    + 16 * (warp % 2) + g2 + t2)
                                            e = (row_in_warp // 8) + 2 * (k // 4)
                                            s += in_hi[base + [0, 8, PITCH, PITCH + 8][e]] * b_elem(fb, ncol + 16, k)
                                    hh[j, i] += s
                        acc += hh
                        hh[:] = 0.0
                oh = oh0 + r2
                for j in range(nd):
                    if oh >= HO:
                        break
                    for i in range(8):
                        c = 8 * (i // 4) + 2 * tq + (i & 1)
                        ow = col0 + 8 if i & 2 else col0
                        if ow >= WO or c >= C_out:
                            continue
                        y[bb, c, od0 + j, oh, ow] = acc[j, i]
    return y


def main() -> int:
    rng = np.random.default_rng(0)
    worst = 0.0
    for shape in [(1, 3, 5, 6, 8, 16), (1, 3, 8, 7, 32, 16), (2, 2, 6, 9, 11, 5), (1, 1, 4, 4, 4, 1)]:
        n, ci, d, h, wd, co = shape
        x = rng.random((n, ci, d, h, wd))
        w = rng.random((co, ci, 4, 4, 4)) - 0.5
        b = rng.random(co)
        for version, scale in ((3, 1.0), (4, 2.0)):
            ref, got = conv3d_ref(x, scale * w, b), emulate(x, w, b, version=version)
            err = float(np.nanmax(np.abs(got - ref))) if not np.isnan(got).any() else float("inf")
            worst = max(worst, err)
            print(shape, f"version {version}: max |emulated − numpy| =", f"{err:.1e}",
                  "unwritten:", int(np.isnan(got).sum()))
    print("OK" if worst < 1e-12 else "MISMATCH")
    return 0 if worst < 1e-12 else 1


if __name__ == "__main__":
    raise SystemExit(main())
