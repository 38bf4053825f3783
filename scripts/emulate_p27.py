#!/usr/bin/env python3
"""A numpy emulation of p27_fused_kernel (kernels/conv3d_gn_mean.cu) for debugging without a GPU.

It mirrors the kernel's shared-memory layout (pitch, slabs with a halo, slack), the work-item mapping, the
masks, the pivot, the warp reduce-scatter lane mapping and the finalisation, in float32 where the kernel is,
and compares with float64 on a few shapes (one forcing slabs). Unstaged shared memory is NaN, so a valid
output that reads it fails. Slow (pure Python loops): small shapes only. It duplicates the kernel's logic:
when the kernel changes, change this too, or delete it.

    python scripts/emulate_p27.py
"""

import numpy as np
import torch
import torch.nn.functional as F

KS, TAPS, CO_T, COLS, WIN, THREADS, WARPS, SLACK = 4, 64, 8, 8, 12, 512, 16, 16


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


def hs6(v):
    return v * np.minimum(np.maximum(v + np.float32(3), np.float32(0)), np.float32(6))


def run(x, w, cb, gw, gb, G, eps, mx=232448):
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
    w_s = np.zeros(C_in * TAPS * C_pad, np.float32)
    for i in range(C_in * TAPS * C_pad):
        co, k = i % C_pad, i // C_pad
        w_s[i] = w.reshape(C_out, -1)[co, k] if co < C_out else 0
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
            for row in range(rows_in):
                ci, r = row // (planes * H), row % (planes * H)
                for col in range(Wp):
                    in_s[ci * ci_stride + r * Wp + col] = (
                        x[b].reshape(C_in, -1)[ci, (od0 * H + r) * W + col] if col < W else 0
                    )
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


if __name__ == "__main__":

    torch.manual_seed(0)
    for N, C_in, D, H, W, C_out, G, shift, mx in [
        (1, 3, 6, 7, 9, 16, 4, 0, 232448),
        (2, 2, 9, 17, 23, 24, 3, 0, 232448),
        (1, 3, 7, 6, 12, 16, 4, 1e3, 232448),
        (1, 1, 9, 5, 8, 8, 2, 0, 2 * 8 * 8 * 2 + 4 * (64 * 8 + 5 * 5 * 12 + 16 + 256 + 16)),
    ]:
        conv = torch.nn.Conv3d(C_in, C_out, 4)
        gn = torch.nn.GroupNorm(G, C_out)
        with torch.no_grad():
            gn.weight.uniform_(-2, 2)
            gn.bias.uniform_(-1, 1)
        x = torch.rand(N, C_in, D, H, W) + shift
        o = run(x, conv.weight.detach(), conv.bias.detach(), gn.weight.detach(), gn.bias.detach(), G, 1e-5, mx)
        r = ref(x, conv.weight.detach(), conv.bias.detach(), gn.weight.detach(), gn.bias.detach(), G, 1e-5)
        err = float((o.double() - r).norm() / r.norm())
        print((N, C_in, D, H, W, C_out, G, shift, mx), "slab", slab(C_in, D, H, W, C_out, mx), "rel err", err)
