// dev/edge/edge_multi.cuh — a candidate for conv_moments.cuh's moments_edge_kernel (not built by the book): the same
// border sums without atomics. The book's kernel takes one sample per block and adds every sum, and every corner
// product, into acc by a double atomicAdd — ≈ 3.3 M per P73 call, 2.2 M of them corner slots that 128 samples add
// into one address each (ncu, H100: L2 53 % busy at 9 % DRAM, 70.8 µs).
#pragma once
#include "../../kernels/conv_moments.cuh"

namespace edgem {
using namespace cbm;

// The first candidate (S samples a block, one atomic per slot per block; removed, in git history at add2d14) ran
// 1.3–2.6× slower on an H100: its 180 registers left one block per SM and the samples ran one after another. This
// one is the book's kernel, one sample per block at its 64 registers, with every atomicAdd replaced by a plain store
// of the same float into part[n][v][t] — V_PART values per thread t (sides 0, 1: 2 lines × 5 lags; sides 2, 3: 2
// lines × 5 lags and 4 corner rows × 2 columns × 5 lags) — and edge_reduce_kernel, a thread per (v, t), adds them
// over the samples in double and adds each total into its acc slot (one atomic per slot). Workspace: N · V_PART ·
// E_THREADS floats (15.7 MB on P73).
constexpr int V_PART = 2 * 10 + 2 * 50;

__device__ __forceinline__ int part_base(int side) { return side < 2 ? 10 * side : 20 + 50 * (side - 2); }

__global__ void __launch_bounds__(E_THREADS) edge_part_kernel(const float* __restrict__ x, MShape s,
                                                              float* __restrict__ part) {
    __shared__ float buf[E_SMEM_FLOATS];
    __shared__ float piv[CI_MAX];
    const int n = blockIdx.x, side = blockIdx.y;
    if (threadIdx.x < CI_MAX) piv[threadIdx.x] = threadIdx.x < s.C ? pivot(x, s, threadIdx.x) : 0.f;
    const int t = threadIdx.x, d1 = t % D1, jc = t / D1 % NJ, i = t / (D1 * NJ);
    const bool valid = t < E_COMBOS && i < s.C && (jc < s.C || jc == CI_MAX) && (jc < CI_MAX || d1 == 0);
    const int j = jc == CI_MAX ? s.C : jc;
    const int staged = s.C + 1;
    const float* xn = x + static_cast<int64_t>(n) * s.C * s.H * s.W;
    // this block's value v of thread t: out[v·E_THREADS]
    float* out = part + (static_cast<int64_t>(n) * V_PART + part_base(side)) * E_THREADS + t;
    float sum[2][ND] = {};
    if (side < 2) {
        const int rb = side == 0 ? 0 : s.H - 2;
        for (int cb = 0; cb < s.W; cb += E_CHUNK) {
            __syncthreads();
#pragma unroll 4
            for (int e = threadIdx.x; e < staged * 4 * E_ROWS_PITCH; e += E_THREADS) {
                const int ch = e / (4 * E_ROWS_PITCH), rr = e / E_ROWS_PITCH % 4, cc = e % E_ROWS_PITCH;
                buf[e] = edge_value(xn, s, piv, ch, rb + rr, cb - 2 + cc);
            }
            __syncthreads();
            if (valid) {
                const int len = min(E_CHUNK, s.W - cb);
#pragma unroll
                for (int rl = 0; rl < 2; ++rl) {
                    const float* pi = buf + (i * 4 + rl) * E_ROWS_PITCH + 2;
                    const float* pj = buf + (j * 4 + rl + d1) * E_ROWS_PITCH;
                    float win[ND] = {0.f, pj[0], pj[1], pj[2], pj[3]};
                    for (int c = 0; c < len; ++c) {
#pragma unroll
                        for (int d = 0; d < ND - 1; ++d) win[d] = win[d + 1];
                        win[ND - 1] = pj[c + 4];
                        const float xi = pi[c];
#pragma unroll
                        for (int d = 0; d < ND; ++d) sum[rl][d] = fmaf(xi, win[d], sum[rl][d]);
                    }
                }
            }
        }
    } else {
        const int cb = side == 2 ? 0 : s.W - 2;
        for (int rc = 0; rc < s.H; rc += E_CHUNK) {
            __syncthreads();
#pragma unroll 4
            for (int e = threadIdx.x; e < staged * (E_CHUNK + 2) * E_COLS_W; e += E_THREADS) {
                const int ch = e / ((E_CHUNK + 2) * E_COLS_W), rr = e / E_COLS_W % (E_CHUNK + 2), cc = e % E_COLS_W;
                buf[e] = edge_value(xn, s, piv, ch, rc + rr, cb - 2 + cc);
            }
            __syncthreads();
            if (!valid) continue;
            const int len = min(E_CHUNK, s.H - rc);
            for (int r = 0; r < len; ++r) {
                const int row = rc + r;
                const float* pi = buf + (i * (E_CHUNK + 2) + r) * E_COLS_W + 2;
                const float* pj = buf + (j * (E_CHUNK + 2) + r + d1) * E_COLS_W;
                const bool border_row = row < 2 || row >= s.H - 2;
#pragma unroll
                for (int cl = 0; cl < 2; ++cl) {
                    const float xi = pi[cl];
                    float z[ND];
#pragma unroll
                    for (int d = 0; d < ND; ++d) {
                        z[d] = xi * pj[cl + d];
                        sum[cl][d] += z[d];
                    }
                    if (!border_row) continue;
#pragma unroll
                    for (int kr = 0; kr < 4; ++kr) {  // each corner row is met once a sample: a store, not a sum
                        if (row != (kr < 2 ? kr : s.H - 4 + kr)) continue;
#pragma unroll
                        for (int d = 0; d < ND; ++d) out[(10 + kr * 10 + cl * 5 + d) * E_THREADS] = z[d];
                    }
                }
            }
        }
    }
    if (!valid) return;
#pragma unroll
    for (int l = 0; l < 2; ++l)
#pragma unroll
        for (int d = 0; d < ND; ++d) out[(l * 5 + d) * E_THREADS] = sum[l][d];
}

// A thread per (v, t): Σ over the samples in double, into v's acc slot.
__global__ void __launch_bounds__(256) edge_reduce_kernel(const float* __restrict__ part, MShape s,
                                                          double* __restrict__ acc) {
    const int id = blockIdx.x * 256 + threadIdx.x, v = id / E_THREADS, t = id % E_THREADS;
    if (v >= V_PART) return;
    const int d1 = t % D1, jc = t / D1 % NJ, i = t / (D1 * NJ);
    if (!(t < E_COMBOS && i < s.C && (jc < s.C || jc == CI_MAX) && (jc < CI_MAX || d1 == 0))) return;
    const int side = v < 20 ? v / 10 : 2 + (v - 20) / 50, lv = v - part_base(side);
    int slot, d;
    if (side < 2) {
        slot = 1 + 2 * side + lv / 5, d = lv % 5;
    } else if (lv < 10) {
        slot = 5 + 2 * (side - 2) + lv / 5, d = lv % 5;
    } else {
        const int kr = (lv - 10) / 10, cl = (lv - 10) / 5 % 2;
        slot = 9 + kr * 4 + 2 * (side - 2) + cl, d = lv % 5;
    }
    double a[4] = {};
    int n = 0;
    for (; n + 4 <= s.N; n += 4)
#pragma unroll
        for (int k = 0; k < 4; ++k) a[k] += part[(static_cast<int64_t>(n + k) * V_PART + v) * E_THREADS + t];
    for (; n < s.N; ++n) a[0] += part[(static_cast<int64_t>(n) * V_PART + v) * E_THREADS + t];
    atomicAdd(acc + combo(i, jc, d1, d) * SLOTS + slot, (a[0] + a[1]) + (a[2] + a[3]));
}

inline cudaError_t edge_partials(const float* x, const MShape& s, float* part, double* acc, cudaStream_t stream) {
    edge_part_kernel<<<dim3(static_cast<unsigned>(s.N), 4), E_THREADS, 0, stream>>>(x, s, part);
    edge_reduce_kernel<<<(V_PART * E_THREADS + 255) / 256, 256, 0, stream>>>(part, s, acc);
    return cudaGetLastError();
}

}  // namespace edgem
