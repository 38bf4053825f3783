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
//     ptxas serialise every wgmma (C7511). Version 4 (P27W_MMA 2) needs no zeroing: X_hi·[W_hi | W_lo] is one
//     m64n32k8 from zero per (ci, h) — both halves join the float32 sum there — and X_lo·W_hi one m64n16k8 chained
//     through K: two wgmmas a step instead of three (the prototype issued one every ≈ 20 cycles per SM, H100).
// A block is one warpgroup (128 threads, 3 blocks per SM at ≤ 168 registers), persistent over units (sample b,
// ND output depths, 2 output rows); it stages a unit's C_in × (ND + 3) × 5 input rows, split, then multiplies: the
// other blocks on the SM overlap its staging. dev/p27w/emulate.py replays every index on the CPU.
#pragma once
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "../../kernels/conv_wgmma.cuh"

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
#define P27W_STAGE 3  // 3: the bulk tensor copy (rows where W % 4 ≠ 0); 2: staged by rows; 1: by elements (first)
#endif
#ifndef P27W_DESC
#define P27W_DESC 2                       // 2: descriptors by one addition per wgmma; 1: recomputed (the first)
#endif
#ifndef P27W_MMA
#define P27W_MMA 1  // 1: three m64n16k8 a step; 2: X_hi·[W_hi | W_lo] as one m64n32k8, then X_lo·W_hi (version 4)
#endif
constexpr int PPW = (DD * IN_ROWS + 3) / 4;  // (depth, row) pairs per warp when staged by rows
constexpr int STEPS_PER_CI = KS * 2;      // (kd, h)
constexpr int STEP_FLOATS = 2 * 32 * 4;   // one step's B: [k half][32 rows][4]
// Shared memory, sized by C_in: the filter [ci][kd][h][k half][32][4] (8 KB a channel); with the bulk copy
// (stage 3) the raw input box [ci][dd][row][32]; the split planes [ci][dd][row][PITCH], hi then lo; the bias; the
// copy's barrier. P27 (C_in = 3): 62 KB with the bulk copy, 50 KB without: 3 blocks per SM either way.
__host__ __device__ constexpr int filter_floats(int c_in) { return c_in * STEPS_PER_CI * STEP_FLOATS; }
__host__ __device__ constexpr int raw_floats(int c_in, int stage) { return stage == 3 ? c_in * DD * IN_ROWS * 32 : 0; }
__host__ __device__ constexpr int plane_floats(int c_in) { return c_in * DD * IN_ROWS * PITCH; }
__host__ __device__ constexpr int smem_bytes(int c_in, int stage) {
    return (filter_floats(c_in) + raw_floats(c_in, stage) + 2 * plane_floats(c_in) + CO) * 4 + 16;
}

struct Shape {
    int N, C_in, D, H, W, C_out, DO, HO, WO;
    int dgroups, rpairs;  // units per sample: ceil(DO / ND) × ceil(HO / 2)
    int64_t units;
};

#ifdef KB_P27W
// The landed wgmma convolution's helpers (the split, the descriptor, wgmma's fences, the barrier), shared.
using cbw::desc;
using cbw::fence_proxy_async;
using cbw::mbar_init;
using cbw::mbar_wait;
using cbw::split;
using cbw::wg_commit;
using cbw::wg_fence;
__device__ __forceinline__ void wg_wait0() { cbw::wg_wait<0>(); }
// The bulk tensor copy's barrier (PTX ISA: mbarrier, cp.async.bulk.tensor).
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// One box of the 5-d input map (W, H, D, C, N) at (0, h, d, 0, n) into shared memory; zeros outside the tensor.
__device__ __forceinline__ void tma_load5(const CUtensorMap* map, uint32_t dst, uint32_t bar, int h, int d, int n) {
    asm volatile(
        "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %3, "
        "%6}], [%2];\n" ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(0), "r"(h), "r"(d), "r"(n)
        : "memory");
}

// d[64×32] (+)= a[64×8] (registers) · b[8×32] (shared memory: W_hi's 16 channels, then W_lo's); kAcc = 0: from zero.
template <int kAcc>
__device__ __forceinline__ void mma32(float (&d)[16], const uint32_t (&a)[4], uint64_t db) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, %21, 1, "
        "1;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(kAcc));
}
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

// Units are counted in 32 bits (the host refuses more than INT_MAX of them): 64-bit divisions cost ≈ 70
// instructions a unit.
__device__ __forceinline__ void unit_coords(int u, const Shape& s, int64_t& b, int& od0, int& oh0) {
    const int q = u / s.rpairs;
    oh0 = (u - q * s.rpairs) * ROWS;
    const int n = q / s.dgroups;
    od0 = (q - n * s.dgroups) * ND;
    b = n;
}

// sums: null → write y; else y is unused and sums[(b·C_out + c)·2 + {0, 1}] += Σ 6h, Σ (6h)² (double, zeroed).
template <int kStage>
__global__ void __launch_bounds__(THREADS, 3)
conv3d_wgmma_kernel(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ bias,
                    float* __restrict__ y, double* __restrict__ sums, Shape s,
                    const __grid_constant__ CUtensorMap xmap) {
#ifdef KB_P27W
    extern __shared__ __align__(128) float smf[];
    float* f_s = smf;
    float* raw = f_s + filter_floats(s.C_in);
    float* in_hi = raw + raw_floats(s.C_in, kStage);
    float* in_lo = in_hi + plane_floats(s.C_in);
    float* b_s = in_lo + plane_floats(s.C_in);
    const uint32_t bar = static_cast<uint32_t>(__cvta_generic_to_shared(b_s + CO));
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
    for (int i = t; i < 2 * plane_floats(s.C_in); i += THREADS) in_hi[i] = 0.f;  // columns past 32 stay zero
    const uint32_t raw_s = static_cast<uint32_t>(__cvta_generic_to_shared(raw));
    const uint32_t box_bytes = raw_floats(s.C_in, kStage) * 4;
    uint32_t parity = 0;
    if (kStage == 3 && t == 0) {
        mbar_init(bar, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        if (blockIdx.x < s.units) {  // the first unit's box
            int64_t b;
            int od0, oh0;
            unit_coords(blockIdx.x, s, b, od0, oh0);
            mbar_expect_tx(bar, box_bytes);
            tma_load5(&xmap, raw_s, bar, oh0, od0, static_cast<int>(b));
        }
    }
    fence_proxy_async();  // the filter, written by the threads, read by wgmma (the async proxy)
    const uint32_t f_base = static_cast<uint32_t>(__cvta_generic_to_shared(f_s));
    // This thread's rows: r2 = warp / 2 (output row oh0 + r2), columns col0 = 16·(warp % 2) + g and col0 + 8.
    const int r2 = warp / 2, col0 = 16 * (warp % 2) + g;
    const int64_t plane = static_cast<int64_t>(s.H) * s.W;

    for (int u = blockIdx.x; u < s.units; u += gridDim.x) {
        int64_t b;
        int od0, oh0;
        unit_coords(u, s, b, od0, oh0);
        const int nd = min(ND, s.DO - od0);
        __syncthreads();  // the last unit's fragments are read (and the filter written, on the first)
        if constexpr (kStage == 3) {
        // The bulk copy brought this unit's box (issued while the last unit multiplied): split it into the planes,
        // then, once every thread has read it, one thread sends the copy engine for the next unit's box.
        mbar_wait(bar, parity);
        parity ^= 1u;
        {
            const int items = raw_floats(s.C_in, kStage);
#pragma unroll 2
            for (int i = 4 * t; i < items; i += 4 * THREADS) {  // four columns a thread, 16-byte accesses
                const int q = i + 4 * (i >> 5);                  // row i / 32, column i % 32 at PITCH 36
                const float4 v = *reinterpret_cast<const float4*>(raw + i);
                float4 hi, lo;
                split(v.x, hi.x, lo.x);
                split(v.y, hi.y, lo.y);
                split(v.z, hi.z, lo.z);
                split(v.w, hi.w, lo.w);
                *reinterpret_cast<float4*>(in_hi + q) = hi;
                *reinterpret_cast<float4*>(in_lo + q) = lo;
            }
        }
        __syncthreads();
        if (t == 0 && u + gridDim.x < s.units) {
            int64_t nb;
            int nd0, nh0;
            unit_coords(u + gridDim.x, s, nb, nd0, nh0);
            fence_proxy_async();  // the threads' reads of the box before the copy engine's writes
            mbar_expect_tx(bar, box_bytes);
            tma_load5(&xmap, raw_s, bar, nh0, nd0, static_cast<int>(nb));
        }
        } else if constexpr (kStage == 2) {
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
        } else {
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
        }
        if constexpr (kStage != 3) __syncthreads();

        // Per output depth j: hh, the hi·hi products of the current (ci, h), from zero; sm, every small product
        // (hi·lo, lo·hi) of all K; acc, the float32 sum of the hh's, from the bias. Register i: row g (+8 if i & 2),
        // channel 8·(i/4) + 2·tq + (i & 1).
        // Version 4 (P27W_MMA 2): hh holds X_hi·[W_hi | W_lo] of the current (ci, h) — registers i < 8 the hi·hi
        // products of channel 8·(i/4) + 2·tq + (i & 1), i + 8 the hi·lo products of the same channel — and sm the
        // lo·hi products through all K; both hh halves join acc per (ci, h).
        constexpr int HH = P27W_MMA == 2 ? 16 : 8;
        float hh[ND][HH], sm[ND][8], acc[ND][8];
#pragma unroll
        for (int j = 0; j < ND; ++j)
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                sm[j][i] = 0.f;
                acc[j][i] = b_s[8 * (i / 4) + 2 * tq + (i & 1)];
            }
#pragma unroll
        for (int j = 0; j < ND; ++j)
#pragma unroll
            for (int i = 0; i < HH; ++i) hh[j][i] = 0.f;
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
#if P27W_MMA == 2
                        mma16<1>(sm[j], al[dd], w_hi);  // the small term through all K
                        if (kd == 0) mma32<0>(hh[j], ah[dd], w_hi);  // rows 0–31 of the step: W_hi, then W_lo
                        else mma32<1>(hh[j], ah[dd], w_hi);
                        (void)w_lo;
#else
                        mma16<1>(sm[j], ah[dd], w_lo);  // the small terms first
                        mma16<1>(sm[j], al[dd], w_hi);
                        if (kd == 0) mma16<0>(hh[j], ah[dd], w_hi);  // compile-time: the group's first step
                        else mma16<1>(hh[j], ah[dd], w_hi);
#endif
                    }
                wg_commit();
                wg_wait0();
#pragma unroll
                for (int j = 0; j < ND; ++j)
#pragma unroll
                    for (int i = 0; i < 8; ++i) {  // the next group's hh starts from zero
                        if constexpr (P27W_MMA == 2) acc[j][i] += hh[j][i] + hh[j][i + 8];
                        else acc[j][i] += hh[j][i];
                    }
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

// P27's finish from the sums mode's per-(sample, channel) Σ 6h, Σ (6h)² (double): with m_c = Σh / n and a group's
// μ_g, var_g (biased, over its channels' n values each), out[b, c] = γ_c·(m_c − μ_g)/√(var_g + ε) + β_c. One
// thread per (sample, group); in double, so E[h²] − μ² does not cancel where |μ| ≫ σ short of ≈ 1e6.
__global__ void finish_kernel(const double* __restrict__ sums, const float* __restrict__ gw,
                              const float* __restrict__ gb, float* __restrict__ out, int N, int C, int groups,
                              double n, float eps) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N * groups) return;
    const int b = i / groups, g = i % groups, cpg = C / groups;
    const double* sg = sums + (static_cast<int64_t>(b) * C + g * cpg) * 2;
    double s1 = 0.0, s2 = 0.0;
    for (int c = 0; c < cpg; ++c) s1 += sg[2 * c], s2 += sg[2 * c + 1];
    const double cnt = 6.0 * n * cpg, mu = s1 / cnt, var = fmax(s2 / (6.0 * cnt) - mu * mu, 0.0);
    const double rstd = 1.0 / sqrt(var + static_cast<double>(eps));
    for (int c = 0; c < cpg; ++c) {
        const int ch = g * cpg + c;
        const double m = sg[2 * c] / (6.0 * n);
        out[static_cast<int64_t>(b) * C + ch] = static_cast<float>((gw ? gw[ch] : 1.f) * (m - mu) * rstd +
                                                                   (gb ? gb[ch] : 0.f));
    }
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

// The input as a 5-d map (W, H, D, C, N) read in boxes of (32, IN_ROWS, DD, C_in, 1): a unit's input, zeros past
// the tensor's edges. The bulk copy needs 16-byte strides (W % 4 == 0) and a 16-byte-aligned x.
static bool input_map(CUtensorMap* map, const float* x, const Shape& s) {
    static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
    if (encode == nullptr) {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult q{};
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) !=
                cudaSuccess || q != cudaDriverEntryPointSuccess)
            return false;
        encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    }
    if (s.W % 4 != 0 || reinterpret_cast<uintptr_t>(x) % 16 != 0) return false;
    const cuuint64_t dims[5] = {static_cast<cuuint64_t>(s.W), static_cast<cuuint64_t>(s.H),
                                static_cast<cuuint64_t>(s.D), static_cast<cuuint64_t>(s.C_in),
                                static_cast<cuuint64_t>(s.N)};
    const cuuint64_t row = static_cast<cuuint64_t>(s.W) * 4, strides[4] = {row, row * s.H, row * s.H * s.D,
                                                                           row * s.H * s.D * s.C_in};
    const cuuint32_t box[5] = {32, IN_ROWS, DD, static_cast<cuuint32_t>(s.C_in), 1}, elem[5] = {1, 1, 1, 1, 1};
    return encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 5, const_cast<float*>(x), dims, strides, box, elem,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// C_in ≤ 4, C_out ≤ 16, W ≤ 32 (and W % 4 == 0 with the bulk copy); an sm_90 GPU and an sm_90a build.
static cudaError_t conv(const float* x, const float* w, const float* b, float* y, double* sums, const Shape& s,
                        int blocks, cudaStream_t stream) {
    if (s.units == 0) return cudaSuccess;
    if (s.C_in < 1 || s.C_in > CI_MAX || s.C_out < 1 || s.C_out > CO || s.W > 32 || s.units > INT_MAX)
        return cudaErrorInvalidValue;
    CUtensorMap map{};
    const bool bulk = P27W_STAGE == 3 && input_map(&map, x, s);  // else staged by rows
    auto kernel = bulk ? conv3d_wgmma_kernel<3> : conv3d_wgmma_kernel<P27W_STAGE == 3 ? 2 : P27W_STAGE>;
    const int smem = smem_bytes(s.C_in, bulk ? 3 : 2);
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return err;
    const int64_t grid = blocks < s.units ? blocks : s.units;
    kernel<<<static_cast<int>(grid), THREADS, smem, stream>>>(x, w, b, y, sums, s, map);
    return cudaGetLastError();
}

}  // namespace p27w
