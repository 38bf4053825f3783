#!/usr/bin/env python3
"""A numpy emulation of p27_fused_kernel (kernels/conv3d_gn_mean.cu) for debugging without a GPU.

It mirrors the kernel's shared-memory layout (pitch, slabs with a halo, slack), the staging index arithmetic
(float4 and scalar paths, every global and shared index bounds-checked), the work-item mapping, the masks,
the pivot, the warp reduce-scatter lane mapping and the finalisation, in float32 where the kernel is, and
compares with float64 on shapes that include P27 under the opt-in shared-memory limits of sm_90, sm_80,
sm_86/89 and sm_75 (1 to 13 depth slabs), padded channel groups, odd sizes, no bias / no affine. Shared memory
not staged for the current slab is NaN, so a valid output that reads it fails, and a count per valid output
checks that each enters the statistics exactly once. Slow (Python loops; about 15 s). It duplicates the
kernel's logic: when the kernel changes, change this too, or delete it.

    python dev/emulate_p27.py
"""

import numpy as np
import torch
import torch.nn.functional as F

KS, TAPS, CO_T, COLS, WIN, THREADS, WARPS, SLACK, STAGE = 4, 64, 8, 8, 12, 512, 16, 16, 8


def pad_groups(c):
    g = (c + 7) // 8
    p = 1
    while p < g:
        p *= 2
    return p


def smem_bytes(C_in, H, Wp, C_out, T):
    c_pad = 8 * pad_groups(C_out)
    return 2 * c_pad * 8 + 4 * (C_in * TAPS * c_pad + C_in * (T + 3) * H * Wp + SLACK + WARPS * CO_T * 2 + 2 * c_pad)


def slab(C_in, D, H, W, C_out, mx):
    DO = D - 3
    Wp = (W + 3) // 4 * 4
    t_max = 0
    for t in range(1, DO + 1):
        if smem_bytes(C_in, H, Wp, C_out, t) <= mx:
            t_max = t
        else:
            break
    if t_max == 0:
        return 0
    sl = -(-DO // t_max)
    return -(-DO // sl)


def stage_rows(src, dst, rows_in, pitch, w, rows_per_ci, dst_ci, src_ci, src_off, src_len, dst_len):
    """The kernel's stage_rows: src/dst are arrays of V-float units (V = 4 or 1); every index checked."""
    items = rows_in * pitch
    tid = np.arange(THREADS, dtype=np.int64)
    for i0b in range(0, items, THREADS * STAGE):
        i0 = i0b + tid
        for u in range(STAGE):
            i = i0 + u * THREADS
            act = (i0 < items) & (i < items)
            row, col = i // pitch, i % pitch
            ci, r = row // rows_per_ci, row % rows_per_ci
            d = ci * dst_ci + r * pitch + col
            ld = act & (col < w)
            si = ci * src_ci + src_off + r * w + col
            assert (si[ld] >= 0).all() and (si[ld] < src_len).all(), "global read outside the sample"
            assert (d[act] >= 0).all() and (d[act] < dst_len).all(), "staging store outside in_s"
            dst[d[act & ~ld]] = 0
            dst[d[ld]] = src[si[ld]]


def hs6(v):
    return v * np.minimum(np.maximum(v + np.float32(3), np.float32(0)), np.float32(6))


def run(x, w, cb, gw, gb, G, eps, mx=232448, aligned=True):
    """The kernel's output; ``aligned`` False takes the scalar staging path (a misaligned x)."""
    x = x.numpy().astype(np.float32)
    w = w.numpy().astype(np.float32)
    N, C_in, D, H, W = x.shape
    C_out = w.shape[0]
    G8 = pad_groups(C_out)
    C_pad = 8 * G8
    DO, HO, WO = D - 3, H - 3, W - 3
    Wp = (W + 3) // 4 * 4
    T = slab(C_in, D, H, W, C_out, mx)
    assert T > 0
    if (Wp // 4) % 2 == 0 and smem_bytes(C_in, H, Wp + 4, C_out, T) <= mx:
        Wp += 4
    CT = -(-WO // COLS)
    in_floats = C_in * (T + 3) * H * Wp + SLACK
    ci_stride = (T + 3) * H * Wp
    assert smem_bytes(C_in, H, Wp, C_out, T) <= mx
    w_s = np.full(C_in * TAPS * C_pad, np.nan, np.float32)
    i = np.arange(C_in * TAPS * C_pad)
    co, k = i % C_pad, i // C_pad
    wf = w.reshape(-1)
    w_s[i] = np.where(co < C_out, wf[np.minimum(co, C_out - 1) * C_in * TAPS + k], 0)
    seen = np.zeros((C_pad // 8, DO, HO, WO), np.int64)  # how often each valid output enters the statistics
    bias_s = np.zeros(C_pad, np.float32)
    if cb is not None:
        bias_s[:C_out] = cb.numpy()
    out = np.zeros((N, C_out), np.float32)
    for b in range(N):
        in_s = np.full(in_floats + 64, np.nan, np.float32)  # NaN: anything read but never staged shows
        in_s[in_floats - SLACK : in_floats] = 0
        red = np.zeros(WARPS * CO_T * 2, np.float32)
        stat = np.zeros((WARPS, 32), np.float32)
        piv = np.zeros(C_pad, np.float32)
        for od0 in range(0, DO, T):
            Tc = min(T, DO - od0)
            planes = Tc + 3
            rows_in = C_in * planes * H
            in_s[: in_floats - SLACK] = np.nan  # the previous slab's planes must not feed a valid output either
            xs = x[b].reshape(-1)
            if W % 4 == 0 and aligned:
                plane4 = H * (W // 4)
                stage_rows(xs.reshape(-1, 4), in_s[: in_floats - SLACK].reshape(-1, 4), rows_in, Wp // 4, W // 4,
                           planes * H, ci_stride // 4, D * plane4, od0 * plane4, xs.size // 4,
                           (in_floats - SLACK) // 4)
            else:
                stage_rows(xs, in_s[: in_floats - SLACK], rows_in, Wp, W, planes * H, ci_stride, D * H * W,
                           od0 * H * W, xs.size, in_floats - SLACK)
            if od0 == 0:
                for c in range(C_pad):
                    v = np.float32(0)
                    for t in range(C_in * TAPS):
                        ci, tap = t // TAPS, t % TAPS
                        kd, kh, kw = tap // 16, (tap // 4) % 4, tap % 4
                        v += in_s[ci * ci_stride + (kd * H + kh) * Wp + kw] * w_s[t * C_pad + c]
                    piv[c] = hs6(np.float32(v + bias_s[c]))
            items = Tc * HO * CT
            for warp in range(WARPS):
                g, slot, slots = warp % G8, warp // G8, WARPS // G8
                co0 = g * CO_T
                for jb in range(slot * 32, items, slots * 32):
                    t = np.zeros((32, 16), np.float32)
                    for lane in range(32):
                        j = jb + lane
                        if j >= items:
                            continue
                        row, q = j // CT, j % CT
                        odl, oh = row // HO, row % HO
                        ip = (odl * H + oh) * Wp + q * COLS
                        acc = np.tile(bias_s[co0 : co0 + 8, None], (1, 8)).astype(np.float32)
                        for ci in range(C_in):
                            for kd in range(4):
                                rp = ip + ci * ci_stride + kd * H * Wp
                                wr = (ci * TAPS + kd * 16) * C_pad + co0
                                for kh in range(4):
                                    base = rp + kh * Wp
                                    assert base % 4 == 0 and base + 12 <= in_floats + 0, (base, in_floats)
                                    v = in_s[base : base + 12]
                                    for kw in range(4):
                                        wq = w_s[wr + (kh * 4 + kw) * C_pad : wr + (kh * 4 + kw) * C_pad + 8]
                                        acc += wq[:, None] * v[None, kw : kw + 8]
                        nv = WO - q * COLS
                        d = acc * np.minimum(np.maximum(acc + 3, 0), 6) - piv[co0 : co0 + 8, None]
                        d = d[:, : max(0, min(8, nv))]
                        seen[g, od0 + odl, oh, q * COLS : q * COLS + d.shape[1]] += 1
                        assert not np.isnan(d).any(), "valid output read unstaged shared memory"
                        t[lane, 0::2] = d.sum(1)
                        t[lane, 1::2] = (d * d).sum(1)
                    # reduce-scatter as the kernel does it
                    for H_ in (8, 4, 2, 1):
                        m = 2 * H_
                        new = t.copy()
                        for lane in range(32):
                            up = (lane & m) != 0
                            other = lane ^ m
                            for i in range(H_):
                                send_o = t[other, i] if (other & m) else t[other, i + H_]
                                keep = t[lane, i + H_] if up else t[lane, i]
                                new[lane, i] = keep + send_o
                        t = new
                    for lane in range(32):
                        stat[warp, lane] += t[lane, 0] + t[lane ^ 1, 0]
        for warp in range(WARPS):
            for lane in range(0, 32, 2):
                red[warp * 16 + (lane >> 1)] = stat[warp, lane]
        assert (seen == b + 1).all(), "a valid output was counted more or less than once"
        n = DO * HO * WO
        mean = np.zeros(C_pad)
        m2 = np.zeros(C_pad)
        for tid in range(C_pad):
            gg, c = tid // 8, tid % 8
            s1 = sum(float(red[(wv * 8 + c) * 2]) for wv in range(gg, WARPS, G8))
            s2 = sum(float(red[(wv * 8 + c) * 2 + 1]) for wv in range(gg, WARPS, G8))
            mean[tid] = (float(piv[tid]) + s1 / n) / 6
            m2[tid] = max(0.0, (s2 - s1 * s1 / n) / 36)
        cpg = C_out // G
        for c in range(C_out):
            c0 = c // cpg * cpg
            mu = mean[c0 : c0 + cpg].sum() / cpg
            M2 = sum(m2[c0 + k] + n * (mean[c0 + k] - mu) ** 2 for k in range(cpg))
            var = M2 / (n * cpg)
            gg_ = float(gw[c]) if gw is not None else 1.0
            be = float(gb[c]) if gb is not None else 0.0
            out[b, c] = gg_ * (mean[c] - mu) / np.sqrt(var + eps) + be
    return torch.from_numpy(out)


def ref(x, w, cb, gw, gb, G, eps):
    h = F.hardswish(F.conv3d(x.double(), w.double(), None if cb is None else cb.double()))
    return F.group_norm(h, G, None if gw is None else gw.double(), None if gb is None else gb.double(), eps).mean(
        dim=[2, 3, 4]
    )


# Opt-in shared memory per block (cudaDevAttrMaxSharedMemoryPerBlockOptin) of GPUs the kernel may meet.
SMEM = {"sm_90": 232448, "sm_80": 166912, "sm_86/89": 101376, "sm_75": 65536}

# (N, C_in, D, H, W, C_out, groups, shift, opt-in limit, aligned x, conv bias, GN affine, expected slab depth)
CASES = [
    (1, 3, 6, 7, 9, 16, 4, 0, SMEM["sm_90"], True, True, True, 3),
    (2, 2, 9, 17, 23, 24, 3, 0, SMEM["sm_90"], True, True, True, 6),       # odd shapes, 24 channels padded to 32
    (1, 3, 7, 6, 12, 16, 4, 1e3, SMEM["sm_90"], True, True, True, 4),      # |mean| >> std
    (1, 1, 9, 5, 8, 8, 2, 0, 2 * 8 * 8 * 2 + 4 * (64 * 8 + 5 * 5 * 12 + 16 + 256 + 16), True, True, True, 3),
    (1, 3, 16, 32, 32, 16, 4, 0, SMEM["sm_90"], True, True, True, 13),     # P27, one slab
    (1, 3, 16, 32, 32, 16, 4, 0, SMEM["sm_80"], True, True, True, 7),      # P27 on an A100: 2 slabs
    (1, 3, 16, 32, 32, 16, 4, 0, SMEM["sm_86/89"], True, True, True, 4),   # 4 slabs (the last of 1 depth)
    (1, 3, 16, 32, 32, 16, 4, 0, SMEM["sm_75"], False, True, True, 1),     # 13 slabs of 1 depth, scalar staging
    (2, 3, 9, 17, 23, 12, 3, 0, SMEM["sm_90"], True, True, True, 6),       # 12 channels: half a group of padding
    (1, 2, 5, 8, 8, 128, 32, 0, SMEM["sm_90"], True, True, True, 2),       # 16 groups of 8, one warp each
    (1, 3, 6, 7, 12, 16, 4, 0, SMEM["sm_90"], False, False, False, 3),     # misaligned x, no bias, no affine
    (1, 3, 6, 7, 13, 16, 1, 0, SMEM["sm_90"], True, True, True, 3),        # W % 4 != 0, one group
]

if __name__ == "__main__":
    torch.manual_seed(0)
    worst = 0.0
    for N, C_in, D, H, W, C_out, G, shift, mx, aligned, bias, affine, t_expected in CASES:
        conv = torch.nn.Conv3d(C_in, C_out, 4, bias=bias)
        gn = torch.nn.GroupNorm(G, C_out, affine=affine)
        if affine:
            with torch.no_grad():
                gn.weight.uniform_(-2, 2)
                gn.bias.uniform_(-1, 1)
        cb = conv.bias.detach() if bias else None
        gw, gb = (gn.weight.detach(), gn.bias.detach()) if affine else (None, None)
        x = torch.rand(N, C_in, D, H, W) + shift
        t = slab(C_in, D, H, W, C_out, mx)
        assert t == t_expected, (t, t_expected)
        o = run(x, conv.weight.detach(), cb, gw, gb, G, 1e-5, mx, aligned)
        r = ref(x, conv.weight.detach(), cb, gw, gb, G, 1e-5)
        err = float((o.double() - r).norm() / r.norm())
        worst = max(worst, err)
        print((N, C_in, D, H, W, C_out, G, shift, mx, aligned, bias, affine), "slab", t, "rel err", f"{err:.2e}",
              flush=True)
    assert worst < 1e-6, worst
    print(f"all {len(CASES)} cases match float64 (worst {worst:.1e})")
