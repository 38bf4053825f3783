// dev/p27w/conv3d_wgmma.cuh — a first wgmma prototype of P27's convolution (not built by the book; see
// notes/wgmma.md, session 20): y = conv3d(x, w) + b, 4×4×4 filters, stride 1, no padding, C_in ≤ 4, C_out ≤ 16,
// W ≤ 32, NCDHW float32, 3xTF32 on warpgroup MMA with A from registers. Two outputs for checking and timing:
// the convolution itself (y), or per (sample, channel) the sums of 6·hardswish(y) and of its square (what P27's
// epilogue needs, up to its pivot), so that the 716 MB intermediate is never written.
//
// The GEMM: pixels are M (wgmma needs M = 64 and P27 has 16 filters), the filters N, K = C_in·64 taps in 8-deep
// steps (ci, kd, kh pair h): k = kw at kh = 2h, k = 4 + kw at kh = 2h + 1.
//   * A, the input, from registers: a warpgroup's 64 rows are two output rows × 32 columns (columns ≥ WO are
//     computed and dropped); lane (g, t) of warp v holds rows g and g + 8 of the warp's 16 at k = t, t + 4 — the
//     mma.sync m16n8k8 A layout — loaded from the staged input (hi and lo planes, split once when staged).
//   * B, the filter, from shared memory, K-major without swizzle: per step [k half][32 rows: W_hi of the 16
//     channels, then W_lo][4 floats] (LBO 512 bytes, SBO 128; W_lo 256 bytes past W_hi). Three m64n16k8 per step:
//     X_hi·W_lo and X_lo·W_hi into one accumulator of small terms, X_hi·W_hi into another (A from registers costs
//     no shared-memory traffic when reused; B is 1.5 KB a step either way).
//   * Depth reuse: the fragment of staged depth dd serves output depths od0 + j with kd = dd − j, so a unit of ND
//     = 3 output depths loads 6 depths' fragments for 12 uses (A traffic × 1/2).
//   * Accumulation: the small products chain inside the tensor core through all of K; the hi·hi products of one
//     (ci, h) — 4 steps — start from zero (scale-d 0) and join a float32 sum by FADD (dev/tap_chains.py's model:
//     ≈ 1.05–1.15× the error of one FADD per step). Zeroing half of one m64n32 accumulator by moves instead made
//     ptxas serialise every wgmma (C7511).
// A block is one warpgroup (128 threads, 3 blocks per SM at ≤ 168 registers), persistent over units (sample b,
// ND output depths, 2 output rows); it stages a unit's C_in × (ND + 3) × 5 input rows, split, then multiplies: the
// other blocks on the SM overlap its staging. dev/p27w/emulate.py replays every index on the CPU.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KB_P27W 1
#endif

namespace p27w {

constexpr int KS = 4;
constexpr int CI_MAX = 4;
constexpr int CO = 16;
#ifndef P27W_ND
#define P27W_ND 3
#endif
constexpr int ND = P27W_ND;               // output depths per unit: 3 at 156 registers (4 spills 24 bytes)
constexpr int DD = ND + KS - 1;           // staged depths
constexpr int ROWS = 2;                   // output rows per unit (the warpgroup's 64 pixels: 2 × 32)
constexpr int IN_ROWS = ROWS + KS - 1;    // 5
constexpr int PITCH = 36;                 // staged row: 32 columns + the 3 a 32-wide window reads past them, + 1
constexpr int THREADS = 128;
#ifndef P27W_STAGE
#define P27W_STAGE 2                      // 2: staged by rows (a warp per row); 1: by elements (the first version)
#endif
#ifndef P27W_DESC
#define P27W_DESC 2                       // 2: descriptors by one addition per wgmma; 1: recomputed (the first)
#endif
constexpr int PPW = (DD * IN_ROWS + 3) / 4;  // (depth, row) pairs per warp when staged by rows
constexpr int STEPS_PER_CI = KS * 2;      // (kd, h)
constexpr int STEP_FLOATS = 2 * 32 * 4;   // one step's B: [k half][32 rows][4]
constexpr int PLANE_FLOATS = CI_MAX * DD * IN_ROWS * PITCH;
constexpr int SMEM_FLOATS = CI_MAX * STEPS_PER_CI * STEP_FLOATS + 2 * PLANE_FLOATS + CO;
constexpr int SMEM_BYTES = SMEM_FLOATS * 4;  // 32 KB of filter + 2 × 17 KB of input + bias: 3 blocks per SM

struct Shape {
    int N, C_in, D, H, W, C_out, DO, HO, WO;
    int dgroups, rpairs;  // units per sample: ceil(DO / 4) × ceil(HO / 2)
    int64_t units;
};

#ifdef KB_P27W
__device__ __forceinline__ void split(float x, float& hi, float& lo) {
    hi = __uint_as_float((__float_as_uint(x) + 0x1000u) & 0xffffe000u);
    lo = x - hi;
}
__device__ __forceinline__ uint64_t desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return static_cast<uint64_t>((addr & 0x3ffff) >> 4) | (static_cast<uint64_t>((lbo >> 4) & 0x3fff) << 16) |
           (static_cast<uint64_t>((sbo >> 4) & 0x3fff) << 32);
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// d[64×16] (+)= a[64×8] (registers) · b[8×16] (shared memory); kAcc = 0: from zero.
template <int kAcc>
__device__ __forceinline__ void mma16(float (&d)[8], const uint32_t (&a)[4], uint64_t db) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n16k8.f32.tf32.tf32 "
        "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, %13, 1, 1;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(kAcc));
}
#endif

__device__ __forceinline__ void unit_coords(int64_t u, const Shape& s, int64_t& b, int& od0, int& oh0) {
    oh0 = static_cast<int>(u % s.rpairs) * ROWS;
    u /= s.rpairs;
    od0 = static_cast<int>(u % s.dgroups) * ND;
    b = u / s.dgroups;
}

// sums: null → write y; else y is unused and sums[(b·C_out + c)·2 + {0, 1}] += Σ 6h, Σ (6h)² (double, zeroed).
__global__ void __launch_bounds__(THREADS, 3)
conv3d_wgmma_kernel(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ bias,
                    float* __restrict__ y, double* __restrict__ sums, Shape s) {
#ifdef KB_P27W
    extern __shared__ __align__(128) float smf[];
    float* f_s = smf;                                               // [ci][kd][h][k half][32][4]
    float* in_hi = f_s + CI_MAX * STEPS_PER_CI * STEP_FLOATS;        // [ci][dd][row][PITCH]
    float* in_lo = in_hi + PLANE_FLOATS;
    float* b_s = in_lo + PLANE_FLOATS;
    const int t = threadIdx.x, warp = t / 32, lane = t % 32, g = lane / 4, tq = lane % 4;
    // The filter, split: element (ci, kd, h, half, n, kw) is W_hi (n < 16) or W_lo (n ≥ 16) of channel n % 16 at
    // (ci, kd, kh = 2h + half, kw); zeros past C_in and C_out.
    for (int i = t; i < s.C_in * STEPS_PER_CI * STEP_FLOATS; i += THREADS) {
        const int kw = i & 3, n = (i >> 2) & 31, half = (i >> 7) & 1, h = (i >> 8) & 1, kd = (i >> 9) & 3,
                  ci = i >> 11;
        const int c = n & 15, kh = 2 * h + half;
        const float v = c < s.C_out ? w[(((static_cast<int64_t>(c) * s.C_in + ci) * KS + kd) * KS + kh) * KS + kw]
                                    : 0.f;
        float hi, lo;
        split(v, hi, lo);
        lo = __uint_as_float((__float_as_uint(lo) + 0x1000u) & 0xffffe000u);
        f_s[i] = n < 16 ? hi : lo;
    }
    if (t < CO) b_s[t] = bias != nullptr && t < s.C_out ? bias[t] : 0.f;
    for (int i = t; i < 2 * PLANE_FLOATS; i += THREADS) in_hi[i] = 0.f;  // columns past 32 stay zero
    fence_proxy_async();  // the filter, written by the threads, read by wgmma (the async proxy)
    const uint32_t f_base = static_cast<uint32_t>(__cvta_generic_to_shared(f_s));
    // This thread's rows: r2 = warp / 2 (output row oh0 + r2), columns col0 = 16·(warp % 2) + g and col0 + 8.
    const int r2 = warp / 2, col0 = 16 * (warp % 2) + g;
    const int64_t plane = static_cast<int64_t>(s.H) * s.W;

    for (int64_t u = blockIdx.x; u < s.units; u += gridDim.x) {
        int64_t b;
        int od0, oh0;
        unit_coords(u, s, b, od0, oh0);
        const int nd = min(ND, s.DO - od0);
        __syncthreads();  // the last unit's fragments are read (and the filter written, on the first)
#if P27W_STAGE == 2
        // Stage by rows: warp v holds the (depth, row) pairs p = PPW·v … PPW·v + PPW − 1 of every input channel,
        // lane = column (32 contiguous floats, one 128-byte load per row); columns 32 … PITCH − 1 stay zero from the
        // start. The pair's indices once per unit, the channel's offset by one addition.
        {
            int off[PPW];
            bool ok[PPW];
#pragma unroll
            for (int k = 0; k < PPW; ++k) {
                const int p = PPW * warp + k, dd = p / IN_ROWS, row = p - dd * IN_ROWS;
                ok[k] = p < DD * IN_ROWS && od0 + dd < s.D && oh0 + row < s.H && lane < s.W;
                off[k] = (od0 + dd) * static_cast<int>(plane) + (oh0 + row) * s.W + lane;
            }
            const float* xb = x + b * s.C_in * s.D * plane;
            for (int ci = 0; ci < s.C_in; ++ci, xb += s.D * plane) {
                float v[PPW];
#pragma unroll
                for (int k = 0; k < PPW; ++k) v[k] = ok[k] ? __ldg(xb + off[k]) : 0.f;
#pragma unroll
                for (int k = 0; k < PPW; ++k) {
                    const int p = PPW * warp + k;
                    if (p < DD * IN_ROWS) split(v[k], in_hi[(ci * DD * IN_ROWS + p) * PITCH + lane],
                                                in_lo[(ci * DD * IN_ROWS + p) * PITCH + lane]);
                }
            }
        }
#else
        // Stage depths od0 … od0+nd+2, rows oh0 … oh0+4 of every input channel, split; zeros outside the image.
        const int items = s.C_in * DD * IN_ROWS * PITCH;
        for (int i0 = t; i0 < items; i0 += THREADS * 8) {
            float v[8];
#pragma unroll
            for (int q = 0; q < 8; ++q) {
                const int i = i0 + q * THREADS;
                const int col = i % PITCH, row = i / PITCH % IN_ROWS, dd = i / (PITCH * IN_ROWS) % DD,
                          ci = i / (PITCH * IN_ROWS * DD);
                const int id = od0 + dd, ih = oh0 + row;
                v[q] = i < items && od0 + dd < s.D && ih < s.H && col < s.W  // depths past nd: zeros, unused
                           ? __ldg(x + ((b * s.C_in + ci) * s.D + id) * plane + static_cast<int64_t>(ih) * s.W + col)
                           : 0.f;
            }
#pragma unroll
            for (int q = 0; q < 8; ++q) {
                const int i = i0 + q * THREADS;
                if (i < items) split(v[q], in_hi[i], in_lo[i]);
            }
        }
#endif
        __syncthreads();

        // Per output depth j: hh, the hi·hi products of the current (ci, h), from zero; sm, every small product
        // (hi·lo, lo·hi) of all K; acc, the float32 sum of the hh's, from the bias. Register i: row g (+8 if i & 2),
        // channel 8·(i/4) + 2·tq + (i & 1).
        float hh[ND][8], sm[ND][8], acc[ND][8];
#pragma unroll
        for (int j = 0; j < ND; ++j)
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                hh[j][i] = sm[j][i] = 0.f;
                acc[j][i] = b_s[8 * (i / 4) + 2 * tq + (i & 1)];
            }
        for (int ci = 0; ci < s.C_in; ++ci) {
            // The low word of channel ci's K-major descriptor: address >> 4 (bits 0–13), LBO 512 >> 4 (16–29).
            const uint32_t d_ci = (((f_base + ci * STEPS_PER_CI * STEP_FLOATS * 4) & 0x3ffff) >> 4) | ((512 >> 4) << 16);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                // Every staged depth's A fragment first (rows col0, col0 + 8 of output row oh0 + r2; k = tq at
                // kh = 2h, tq + 4 at kh = 2h + 1), one fence, then the products: a fence between wgmmas of one
                // group made ptxas serialise them.
                uint32_t ah[DD][4], al[DD][4];
#pragma unroll
                for (int dd = 0; dd < DD; ++dd) {
                    const int base = ((ci * DD + dd) * IN_ROWS + r2 + 2 * h) * PITCH + col0 + tq;
                    const int off[4] = {0, 8, PITCH, PITCH + 8};
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        ah[dd][e] = __float_as_uint(in_hi[base + off[e]]);
                        al[dd][e] = __float_as_uint(in_lo[base + off[e]]);
                    }
                }
                wg_fence();
#pragma unroll
                for (int dd = 0; dd < DD; ++dd)
#pragma unroll
                    for (int j = 0; j < ND; ++j) {
                        const int kd = dd - j;
                        if (kd < 0 || kd >= KS) continue;  // compile-time: no branch between the wgmmas (a run-time
                                                           // one, j < nd, made ptxas serialise them all: C7511)
#if P27W_DESC == 2  // the channel's descriptor once, each step's by one 32-bit addition to its address field
                        const uint32_t lo = d_ci + ((((kd * 2 + h) * STEP_FLOATS) * 4) >> 4);
                        const uint64_t w_hi = (static_cast<uint64_t>(128 >> 4) << 32) | lo,
                                       w_lo = (static_cast<uint64_t>(128 >> 4) << 32) | (lo + (256 >> 4));
#else
                        const uint32_t fb = f_base + (((ci * KS + kd) * 2 + h) * STEP_FLOATS) * 4;
                        const uint64_t w_hi = desc(fb, 512, 128), w_lo = desc(fb + 256, 512, 128);  // rows 16–31
#endif
                        mma16<1>(sm[j], ah[dd], w_lo);  // the small terms first
                        mma16<1>(sm[j], al[dd], w_hi);
                        if (kd == 0) mma16<0>(hh[j], ah[dd], w_hi);  // compile-time: the group's first step
                        else mma16<1>(hh[j], ah[dd], w_hi);
                    }
                wg_commit();
                wg_wait0();
#pragma unroll
                for (int j = 0; j < ND; ++j)
#pragma unroll
                    for (int i = 0; i < 8; ++i) acc[j][i] += hh[j][i];  // the next group's hh starts from zero
            }
        }
        // Join: the small terms' sums (hi·lo in d1's columns 16–31, lo·hi in d2), then the hi·hi sum.
        const int ow_a = col0, ow_b = col0 + 8, oh = oh0 + r2;
        double part[4][2] = {};  // per this thread's 4 channels: Σ 6h, Σ (6h)²
#pragma unroll
        for (int j = 0; j < ND; ++j) {
            if (j >= nd || oh >= s.HO) break;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const float v = acc[j][i] + sm[j][i];
                const int c = 8 * (i / 4) + 2 * tq + (i & 1), ow = (i & 2) ? ow_b : ow_a;
                if (ow >= s.WO || c >= s.C_out) continue;
                if (sums == nullptr) {
                    y[(((b * s.C_out + c) * s.DO + od0 + j) * s.HO + oh) * s.WO + ow] = v;
                } else {
                    const float h6 = v * fminf(fmaxf(v + 3.f, 0.f), 6.f);
                    part[(i / 4) * 2 + (i & 1)][0] += h6;
                    part[(i / 4) * 2 + (i & 1)][1] += static_cast<double>(h6) * h6;
                }
            }
        }
        if (sums != nullptr) {
#pragma unroll
            for (int k = 0; k < 4; ++k)
#pragma unroll
                for (int m = 0; m < 2; ++m) {
                    double v = part[k][m];
#pragma unroll
                    for (int o = 4; o < 32; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);  // over g
                    const int c = 8 * (k / 2) + 2 * tq + (k & 1);
                    if (g == 0 && c < s.C_out) atomicAdd(sums + (b * s.C_out + c) * 2 + m, v);
                }
        }
    }
#endif  // KB_P27W
}

inline Shape make_shape(int64_t N, int C_in, int D, int H, int W, int C_out) {
    Shape s{static_cast<int>(N), C_in, D, H, W, C_out, D - KS + 1, H - KS + 1, W - KS + 1, 0, 0, 0};
    if (s.DO > 0 && s.HO > 0 && s.WO > 0) {
        s.dgroups = (s.DO + ND - 1) / ND;
        s.rpairs = (s.HO + ROWS - 1) / ROWS;
        s.units = N * s.dgroups * s.rpairs;
    }
    return s;
}

// C_in ≤ 4, C_out ≤ 16, W ≤ 32; an sm_90 GPU and an sm_90a build.
static cudaError_t conv(const float* x, const float* w, const float* b, float* y, double* sums, const Shape& s,
                        int blocks, cudaStream_t stream) {
    if (s.units == 0) return cudaSuccess;
    if (s.C_in < 1 || s.C_in > CI_MAX || s.C_out < 1 || s.C_out > CO || s.W > 32) return cudaErrorInvalidValue;
    cudaError_t err = cudaFuncSetAttribute(conv3d_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           SMEM_BYTES);
    if (err != cudaSuccess) return err;
    const int64_t grid = blocks < s.units ? blocks : s.units;
    conv3d_wgmma_kernel<<<static_cast<int>(grid), THREADS, SMEM_BYTES, stream>>>(x, w, b, y, sums, s);
    return cudaGetLastError();
}

}  // namespace p27w
