// dev/edge/edge_multi.cuh — a candidate for conv_moments.cuh's moments_edge_kernel (not built by the book): the same
// border sums, with each block summing S samples before its atomics. The book's kernel takes one sample per block
// and adds every sum, and every corner product, into acc by a double atomicAdd — ≈ 3.3 M per P73 call, 2.2 M of
// them corner slots that 128 samples add into one address each; ncu (H100) found it bound there: L2 53 % busy at
// 9 % DRAM, 70.8 µs. Here the line sums stay float per sample (as the book's) and join double registers; the corner
// products join double registers directly (as exact as the book's atomics); one atomicAdd per slot per block at
// the end: the count falls by S. Grid: (ceil(N / S), 4 sides); block: 256 threads, a thread per (i, j, d1).
#pragma once
#include "../../kernels/conv_moments.cuh"

namespace edgem {
using namespace cbm;

template <int S>
__global__ void __launch_bounds__(E_THREADS) edge_multi_kernel(const float* __restrict__ x, MShape s,
                                                               double* __restrict__ acc) {
    __shared__ float buf[E_SMEM_FLOATS];
    __shared__ float piv[CI_MAX];
    const int n0 = blockIdx.x * S, side = blockIdx.y;
    if (threadIdx.x < CI_MAX) piv[threadIdx.x] = threadIdx.x < s.C ? pivot(x, s, threadIdx.x) : 0.f;
    const int t = threadIdx.x, d1 = t % D1, jc = t / D1 % NJ, i = t / (D1 * NJ);
    const bool valid = t < E_COMBOS && i < s.C && (jc < s.C || jc == CI_MAX) && (jc < CI_MAX || d1 == 0);
    const int j = jc == CI_MAX ? s.C : jc;  // staged channel index: the ones channel follows the inputs
    const int staged = s.C + 1;
    double tot[2][ND] = {};       // the two lines' sums over the block's samples
    double corner[4][2][ND] = {};  // column sides: the corner products, per border row kr and column cl
    for (int n = n0; n < min(n0 + S, s.N); ++n) {
        const float* xn = x + static_cast<int64_t>(n) * s.C * s.H * s.W;
        float sum[2][ND] = {};
        if (side < 2) {
            const int rb = side == 0 ? 0 : s.H - 2;  // lines rb, rb + 1; partners up to rb + 3
            for (int cb = 0; cb < s.W; cb += E_CHUNK) {
                __syncthreads();  // piv written; the previous chunk's reads done
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
                        float win[ND] = {0.f, pj[0], pj[1], pj[2], pj[3]};  // x_j at c − 2 .. c + 2
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
            const int cb = side == 2 ? 0 : s.W - 2;  // lines cb, cb + 1; partners cb − 2 .. cb + 3
            for (int rc = 0; rc < s.H; rc += E_CHUNK) {
                __syncthreads();
#pragma unroll 4
                for (int e = threadIdx.x; e < staged * (E_CHUNK + 2) * E_COLS_W; e += E_THREADS) {
                    const int ch = e / ((E_CHUNK + 2) * E_COLS_W), rr = e / E_COLS_W % (E_CHUNK + 2),
                              cc = e % E_COLS_W;
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
                        for (int kr = 0; kr < 4; ++kr) {  // also a corner (slots repeat when H < 4)
                            if (row != (kr < 2 ? kr : s.H - 4 + kr)) continue;
#pragma unroll
                            for (int d = 0; d < ND; ++d) corner[kr][cl][d] += static_cast<double>(z[d]);
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int l = 0; l < 2; ++l)
#pragma unroll
            for (int d = 0; d < ND; ++d) tot[l][d] += static_cast<double>(sum[l][d]);
    }
    if (!valid) return;
    const int slot0 = side < 2 ? 1 + 2 * side : 5 + 2 * (side - 2);  // rows: 1 + 2·side + rl; columns: 5 + kc + cl
#pragma unroll
    for (int l = 0; l < 2; ++l)
#pragma unroll
        for (int d = 0; d < ND; ++d) atomicAdd(acc + combo(i, jc, d1, d) * SLOTS + slot0 + l, tot[l][d]);
    if (side < 2) return;
    const int kc = 2 * (side - 2);
#pragma unroll
    for (int kr = 0; kr < 4; ++kr)
#pragma unroll
        for (int cl = 0; cl < 2; ++cl)
#pragma unroll
            for (int d = 0; d < ND; ++d)
                atomicAdd(acc + combo(i, jc, d1, d) * SLOTS + 9 + kr * 4 + kc + cl, corner[kr][cl][d]);
}

// acc as moments_fold's (zeroed, ACC_DOUBLES); adds the border slots 1–24 of every combo.
template <int S>
cudaError_t edge(const float* x, const MShape& s, double* acc, cudaStream_t stream) {
    edge_multi_kernel<S><<<dim3(static_cast<unsigned>((s.N + S - 1) / S), 4), E_THREADS, 0, stream>>>(x, s, acc);
    return cudaGetLastError();
}

}  // namespace edgem
