"""Replay dev/mw/moments_wgmma.cuh's indices on the CPU: the raw tile, the split into A and B (byte offsets as
the kernel writes them), each wgmma's operands read back through its descriptors (K-major, no swizzle), the
accumulator registers as each lane owns them, and the sums the lanes keep — then compare with numpy's lag sums.
Float64 throughout (the split is exact, lo·lo included), so any index error shows as a large difference.

    python dev/mw/emulate.py
"""

from __future__ import annotations

import numpy as np

CI, R, TW = 8, 4, 32
AROWS, AP, BP, RAW_W = R + 3, TW // 4, TW // 4 + 1, TW + 12
KSTEPS = TW // 8
A_BYTES = AROWS * 2 * AP * CI * 16
B_BYTES = R * BP * 4 * 2 * CI * 16


def split(v):
    """TF32 round (ties away), the exact remainder: the kernel's cbw::split, in float64 on float32 values."""
    u = np.asarray(v, np.float32).view(np.uint32)
    hi = ((u + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)
    return hi, np.asarray(v, np.float64) - hi


def read_kmajor(mem: np.ndarray, start: int, lbo: int, sbo: int, rows: int, k: int = 8) -> np.ndarray:
    """The rows × k matrix a no-swizzle K-major descriptor names in `mem` (float64 per 4-byte word)."""
    out = np.empty((rows, k))
    for m in range(rows):
        for kk in range(k):
            addr = start + (m // 8) * sbo + (kk // 4) * lbo + (m % 8) * 16 + (kk % 4) * 4
            out[m, kk] = mem[addr // 4]
    return out


def tile_sums(x: np.ndarray, piv: np.ndarray, n: int, r0: int, c0: int) -> np.ndarray:
    """G[d1, d2i, i, j] of one tile as the kernel's lanes sum it."""
    C, H, W = x.shape[1:]
    raw = np.zeros((CI, AROWS, RAW_W))
    for ch in range(C):
        for row in range(AROWS):
            for col in range(RAW_W):
                r, c = r0 - 2 + row, c0 - 4 + col
                if 0 <= r < H and 0 <= c < W:
                    raw[ch, row, col] = np.float32(np.float32(x[n, ch, r, c]) - piv[ch])
    raw = raw.reshape(-1)
    mem = np.full((A_BYTES + B_BYTES) // 4, np.nan)
    # A: item (s, p, i): raw row s, columns 4 + 4p …, into [s][ha][p][i][4]
    for s in range(AROWS):
        for p in range(AP):
            for i in range(CI):
                src = raw[(i * AROWS + s) * RAW_W + 4 + 4 * p:][:4]
                hi, lo = split(src)
                mem[(((s * 2 + 0) * AP + p) * CI + i) * 4:][:4] = hi
                mem[(((s * 2 + 1) * AP + p) * CI + i) * 4:][:4] = lo
    # B: lane (j, sh), item (tt, P): raw row tt + 2, columns 4P + sh …
    b0 = A_BYTES // 4
    for tt in range(R):
        for P in range(BP):
            for sh in range(4):
                for j in range(CI):
                    src = raw[(j * AROWS + tt + 2) * RAW_W + 4 * P + sh:][:4]
                    hi, lo = split(src)
                    dst = b0 + ((((tt * BP + P) * 4 + sh) * 2) * CI + j) * 4
                    mem[dst:dst + 4] = hi
                    mem[dst + CI * 4:dst + CI * 4 + 4] = lo
    G = np.zeros((3, 5, CI, CI))
    for tt in range(R):
        for kk in range(KSTEPS):
            A = read_kmajor(mem, (tt * 2 * AP + 2 * kk) * CI * 16, CI * 16, AP * CI * 16, 64)
            B = read_kmajor(mem, A_BYTES + ((tt * BP + 2 * kk) * 4 + 2) * 2 * CI * 16, 4 * 2 * CI * 16, CI * 16, 80)
            assert not np.isnan(A).any() and not np.isnan(B).any(), "a descriptor reads unwritten memory"
            D = A @ B.T  # 64 × 80
            for w in range(3):  # warp 3 (row ρ + 1) dropped
                for lane in range(32):
                    g, tq = lane // 4, lane % 4
                    reg = np.empty(40)
                    for r in range(40):
                        n8, h, e = r // 4, (r // 2) % 2, r % 2
                        reg[r] = D[16 * w + g + 8 * h, 8 * n8 + 2 * tq + e]
                    for dd in range(5):
                        for e in range(2):
                            hl, lh = reg[4 * (2 * dd + 1) + e], reg[4 * (2 * dd) + 2 + e]
                            small = (hl + lh) + reg[4 * (2 * dd + 1) + 2 + e]  # + lo·lo
                            G[2 - w, dd, g, 2 * tq + e] += small + reg[4 * (2 * dd) + e]
    return G


def main() -> int:
    rng = np.random.default_rng(0)
    worst = 0.0
    for (N, C, H, W) in [(1, 8, 6, 32), (2, 3, 5, 37), (1, 1, 3, 3), (1, 8, 9, 40)]:
        x = rng.standard_normal((N, C, H, W)).astype(np.float32) + 0.5
        piv = np.array([np.float32(np.mean(x[0, ch, ::max(1, (H - 1) // 3), ::max(1, (W - 1) // 3)]))
                        for ch in range(C)], np.float32)  # any float32 pivot: the replay's own
        G = np.zeros((3, 5, CI, CI))
        for n in range(N):
            for r0 in range(0, H, R):
                for c0 in range(0, W, TW):
                    G += tile_sums(x, piv, n, r0, c0)
        xt = (x - piv[None, :, None, None]).astype(np.float32).astype(np.float64)
        pad = np.pad(xt, ((0, 0), (0, 0), (0, 2), (2, 2)))
        for d1 in range(3):
            for dd in range(5):
                sh = pad[:, :, d1:d1 + H, dd:dd + W]  # x_j(q + (d1, dd − 2))
                ref = np.einsum("nihw,njhw->ij", xt, sh)
                err = np.abs(G[d1, dd, :C, :C] - ref).max() / max(np.abs(ref).max(), 1e-300)
                worst = max(worst, err)
        print(f"shape {(N, C, H, W)}: worst relative difference so far {worst:.2e}")
    ok = worst < 1e-12
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
