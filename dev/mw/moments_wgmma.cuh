// dev/mw/moments_wgmma.cuh — a prototype (not built by the book): the moments strategy's lag sums on Hopper's
// warpgroup MMA, both operands from shared memory, 3xTF32. It computes what conv_moments.cuh's moments_tc_kernel
// does — for every lag (d1, d2), d1 ∈ 0..2, d2 ∈ −2..2, and channels i, j < C ≤ 8,
//     acc[combo(i, j, d1, d2 + 2)·SLOTS] += Σ_q x̃_i(q)·x̃_j(q + (d1, d2))   (x̃ = x − pivot, zero outside the image),
// and acc[combo(i, CI_MAX, 0, 2)·SLOTS] += Σ_q x̃_i(q) — so it can replace that kernel (the border kernel stays).
//
// One wgmma.m64n80k8 per output row ρ and 8 columns c … c+7 (K = the columns) computes all 15 lags at once:
//   * A[m][k], m = (rr, ha, i) (8 core-matrix groups of 8 channels): x̃_i of row ρ − 2 + rr, column c + k, plane ha
//     (hi or lo). rr = 0, 1, 2 are row lags d1 = 2, 1, 0; rr = 3 (row ρ + 1) is computed and dropped.
//     Staged [s: rows r0−2 … r0+R][ha][p: 4-column groups][i][4] — the (rr, ha) groups of one ρ are consecutive,
//     1 KB apart (SBO), the K halves 128 B (LBO): a row lag is a 2 KB step of the descriptor's start.
//   * B[k][n], n = (d2, hb, j) (10 groups): x̃_j of row ρ, column c + k + d2, plane hb. TF32 operands must be
//     K-major, so a column shift by d2 that is not a multiple of 4 needs its own copy: staged [t: rows r0 …
//     r0+R−1][P: 4-column groups, c0 − 4 …][sh: shift 0..3][hb][j][4]. The five lags are then ten consecutive
//     groups, 128 B apart (SBO), starting at (P = 2kk, sh = 2): (P, 2), (P, 3), (P + 1, 0), (P + 1, 1), (P + 1, 2)
//     are d2 = −2 … 2; the K halves 1 KB apart (LBO).
//   * D[(rr, ha, i)][(d2, hb, j)] holds the four plane products of G(d1, d2)[i][j]; lane (g, t) of warp w owns
//     rr = w, i = g, both ha, all (d2, hb) and j = 2t, 2t + 1, so it joins hi·hi + (hi·lo + lo·hi) itself (lo·lo
//     dropped): 10 sums of the 40 accumulators, no shuffles.
// Accumulation as moments_tc_kernel's: every wgmma from zero (8 products a chain inside the tensor core), its
// hi·hi and small terms added into float sums per tile (R rows × TW columns), the tiles' sums into doubles per
// thread, and one atomicAdd per sum at the end. KG wgmmas (independent accumulators) per commit group.
// Warp-specialised: warpgroup 0 loads a tile's input (rows r0−2 … r0+R, columns c0−4 … c0+TW+7, pivot-shifted,
// zeros outside) into a raw buffer, then splits it into a free stage's A and B; warpgroups 1, 2 take alternate
// tiles (stage 2k + c feeds consumer c). Shared memory (R = 4, TW = 32, 4 stages): 4 × 50 KB + the raw 9.6 KB.
#pragma once
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "../../kernels/conv_moments.cuh"
#include "../../kernels/conv_wgmma.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KB_MW 1
#endif

namespace mw {

constexpr int CI = cbm::CI_MAX;           // 8 channels: the wgmma's core-matrix rows
#ifndef MW_R
#define MW_R 4
#endif
#ifndef MW_KG
#define MW_KG 2  // wgmmas per commit group (independent accumulators: the tensor core runs them back to back)
#endif
constexpr int R = MW_R;                   // output rows ρ per tile
constexpr int TW = 32;                    // columns per tile
constexpr int KSTEPS = TW / 8;            // wgmmas per row
constexpr int KG = MW_KG;
static_assert(KSTEPS % KG == 0, "groups of KG wgmmas per row");
constexpr int AROWS = R + 3;              // A's rows r0 − 2 … r0 + R
constexpr int AP = TW / 4;                // A's 4-column groups
constexpr int BP = TW / 4 + 1;            // B's 4-column groups P (columns c0 − 4 …; the last wgmma reads P = AP)
constexpr int RAW_W = TW + 12;            // raw columns c0 − 4 … c0 + TW + 7 (B reads up to c0 + TW + 2; 44 keeps
                                          // the channel pitch 308 ≡ 20 mod 32: conflict-free reads)
constexpr int STAGES = 4;                 // even: consumer c owns stages c, c + 2
constexpr int THREADS = 384;
constexpr int A_BYTES = AROWS * 2 * AP * CI * 16;   // 14,336
constexpr int B_BYTES = R * BP * 4 * 2 * CI * 16;   // 36,864
constexpr int STAGE_BYTES = A_BYTES + B_BYTES;
constexpr int RAW_OFF = STAGES * STAGE_BYTES;
constexpr int RAW_FLOATS = CI * AROWS * RAW_W;      // [ch][row][col]: channel pitch 308 ≡ 20 (mod 32)
constexpr int BAR_OFF = RAW_OFF + RAW_FLOATS * 4;
constexpr int SMEM_BYTES = BAR_OFF + 2 * STAGES * 8;
constexpr int PER = (RAW_FLOATS + 127) / 128;       // raw values a producer thread loads
static_assert(SMEM_BYTES <= 232448, "fits the opt-in shared memory of an sm_90 block");
static_assert(STAGES % 2 == 0 && BAR_OFF % 8 == 0 && STAGE_BYTES % 128 == 0, "stages, barriers, alignment");

struct Shape {
    int N, C, H, W;
    int row_tiles, col_tiles;
    int tiles;  // N · row_tiles · col_tiles (< 2^31: the host checks)
};

#ifdef KB_MW
using cbw::fence_proxy_async;
using cbw::mbar_arrive;
using cbw::mbar_init;
using cbw::mbar_wait;
using cbw::smem_u32;
using cbw::split;
using cbw::wg_commit;
using cbw::wg_fence;

#define MW_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
                 "+f"(d[i + 6]), "+f"(d[i + 7])
// d[64×80] = a[64×8] · b[8×80], both from shared memory (TF32 in, float32 out), from zero (scale-d 0).
__device__ __forceinline__ void mma80(float (&d)[40], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %42, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n80k8.f32.tf32.tf32 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
        "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39}, "
        "%40, %41, p, 1, 1;\n}\n"
        : MW_D8(0), MW_D8(8), MW_D8(16), MW_D8(24), MW_D8(32)
        : "l"(da), "l"(db), "r"(0));
}
#undef MW_D8

__device__ __forceinline__ void tile_coords(int tile, const Shape& s, int& n, int& r0, int& c0) {
    c0 = (tile % s.col_tiles) * TW;
    tile /= s.col_tiles;
    r0 = (tile % s.row_tiles) * R;
    n = tile / s.row_tiles;
}

// The producer's loads of one tile: raw value e = (ch·AROWS + row)·RAW_W + col is x_ch at image row r0 − 2 + row,
// column c0 − 4 + col (zero outside the image and for channels ≥ C; bit k of mask: value k is inside).
__device__ __forceinline__ void load_raw(float (&v)[PER], uint32_t& mask, const float* __restrict__ x,
                                         const Shape& s, int n, int r0, int c0, int t) {
#pragma unroll
    for (int k = 0; k < PER; ++k) {
        const int e = t + 128 * k;
        const int ch = e / (AROWS * RAW_W), rest = e - ch * (AROWS * RAW_W);
        const int row = r0 - 2 + rest / RAW_W, col = c0 - 4 + rest % RAW_W;
        const bool in = e < RAW_FLOATS && ch < s.C && row >= 0 && row < s.H && col >= 0 && col < s.W;
        v[k] = in ? __ldg(x + ((static_cast<int64_t>(n) * s.C + ch) * s.H + row) * s.W + col) : 0.f;
        mask = k == 0 ? static_cast<uint32_t>(in) : mask | static_cast<uint32_t>(in) << k;
    }
}

// The raw values into shared memory, pivot-shifted where inside the image (`mask` from load_raw): the shift waits
// for the loads, so it happens here, after the previous tile's split, not in load_raw.
__device__ __forceinline__ void store_raw(float* raw, const float (&v)[PER], uint32_t mask, const float* piv, int t) {
#pragma unroll
    for (int k = 0; k < PER; ++k) {
        const int e = t + 128 * k;
        if (e < RAW_FLOATS) raw[e] = (mask >> k & 1u) ? v[k] - piv[e / (AROWS * RAW_W)] : 0.f;
    }
}

// Split the raw tile into a stage: A (rows × 4-column groups × channels, hi and lo) and B (rows ρ × groups P ×
// shifts × planes × channels). Returns this thread's share of Σ x̃_j over the tile's own positions (lane < 8:
// channel j = lane; B's shift 0, groups P = 1 … AP, rows ρ < H and columns < W are already zero-filled).
__device__ __forceinline__ float scatter(unsigned char* st, const float* raw, int t) {
    float* a = reinterpret_cast<float*>(st);
    float* b = reinterpret_cast<float*>(st + A_BYTES);
    // A: item (s, p, i), i fastest: a float4 of raw row s, columns 4 + 4p …, into [s][ha][p][i][4].
    for (int it = t; it < AROWS * AP * CI; it += 128) {
        const int i = it % CI, p = it / CI % AP, s = it / (CI * AP);
        const float4 u = *reinterpret_cast<const float4*>(raw + (i * AROWS + s) * RAW_W + 4 + 4 * p);
        float4 hi, lo;
        split(u.x, hi.x, lo.x);
        split(u.y, hi.y, lo.y);
        split(u.z, hi.z, lo.z);
        split(u.w, hi.w, lo.w);
        *reinterpret_cast<float4*>(a + (((s * 2 + 0) * AP + p) * CI + i) * 4) = hi;
        *reinterpret_cast<float4*>(a + (((s * 2 + 1) * AP + p) * CI + i) * 4) = lo;
    }
    // B: lane = j + 8·sh, the warp's items (ρ = r0 + tt, P): raw row tt + 2, columns 4P + sh … + 3.
    const int j = t % CI, sh = t / CI % 4, w = t / 32;
    float s1 = 0.f;
    for (int it = w; it < R * BP; it += 4) {
        const int P = it % BP, tt = it / BP;
        const float* src = raw + (j * AROWS + tt + 2) * RAW_W + 4 * P + sh;
        float4 hi, lo;
        split(src[0], hi.x, lo.x);
        split(src[1], hi.y, lo.y);
        split(src[2], hi.z, lo.z);
        split(src[3], hi.w, lo.w);
        if (sh == 0 && P >= 1 && P <= AP) s1 += (src[0] + src[1]) + (src[2] + src[3]);
        float* dst = b + ((((tt * BP + P) * 4 + sh) * 2) * CI + j) * 4;
        *reinterpret_cast<float4*>(dst) = hi;
        *reinterpret_cast<float4*>(dst + CI * 4) = lo;
    }
    return s1;
}

#endif  // KB_MW

__global__ void __launch_bounds__(THREADS, 1)
moments_wgmma_kernel(const float* __restrict__ x, Shape s, double* __restrict__ acc) {
#ifdef KB_MW
    extern __shared__ __align__(128) unsigned char sm[];
    __shared__ float piv[CI];
    const uint32_t base = smem_u32(sm);
    const uint32_t bars = base + BAR_OFF;  // full[STAGES], then empty[STAGES]
    const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
    if (threadIdx.x < CI) piv[threadIdx.x] = threadIdx.x < s.C ? cbm::pivot(x, s.H, s.W, threadIdx.x) : 0.f;
    if (threadIdx.x == 0) {
        for (int i = 0; i < STAGES; ++i) {
            mbar_init(bars + 8 * i, 128);             // full: every producer thread has written its part
            mbar_init(bars + 8 * (STAGES + i), 128);  // empty: its consumer's products are done
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {  // the producer
        float* raw = reinterpret_cast<float*>(sm + RAW_OFF);
        float v[PER];
        uint32_t mask = 0;
        static_assert(PER <= 32, "one mask bit per loaded value");
        double s1d = 0.0;
        int it = 0, tile = blockIdx.x;
        if (tile < s.tiles) {
            int n, r0, c0;
            tile_coords(tile, s, n, r0, c0);
            load_raw(v, mask, x, s, n, r0, c0, t);
        }
        for (; tile < s.tiles; tile += gridDim.x, ++it) {
            asm volatile("bar.sync 1, 128;\n" ::: "memory");  // the last tile's raw values are split
            store_raw(raw, v, mask, piv, t);
            asm volatile("bar.sync 1, 128;\n" ::: "memory");
            if (tile + gridDim.x < s.tiles) {  // the next tile's loads fly while this one is split
                int n, r0, c0;
                tile_coords(tile + gridDim.x, s, n, r0, c0);
                load_raw(v, mask, x, s, n, r0, c0, t);
            }
            const int st = it % STAGES;
            mbar_wait(bars + 8 * (STAGES + st), ((it / STAGES) & 1) ^ 1);
            s1d += scatter(sm + st * STAGE_BYTES, raw, t);
            fence_proxy_async();
            mbar_arrive(bars + 8 * st);
        }
        if (t % 32 < CI && t % 32 < s.C)  // lanes 0 … 7 of each warp hold channel lane's share
            atomicAdd(acc + cbm::combo(t % 32, cbm::CI_MAX, 0, 2) * cbm::SLOTS, s1d);
        return;
    }
    const int cw = wg - 1;  // this consumer takes the block's tiles cw, cw + 2, …
    const int warp = t / 32, lane = t % 32, g = lane / 4, tq = lane % 4;
    double sd[5][2] = {};  // per (d2 + 2, j − 2tq): G over the tiles
    for (int it = cw, tile = blockIdx.x + cw * gridDim.x; tile < s.tiles; it += 2, tile += 2 * gridDim.x) {
        const int st = it % STAGES;
        mbar_wait(bars + 8 * st, (it / STAGES) & 1);
        const uint32_t a0 = base + st * STAGE_BYTES, b0 = a0 + A_BYTES;
        float hh[5][2] = {}, sm2[5][2] = {};  // the tile's hi·hi and small terms
#pragma unroll 1
        for (int tt = 0; tt < R; ++tt) {
#pragma unroll
            for (int k0 = 0; k0 < KSTEPS; k0 += KG) {
                float d[KG][40];
                wg_fence();
#pragma unroll
                for (int k = 0; k < KG; ++k) {
                    const int kk = k0 + k;
                    // A: rows ρ − 2 … ρ + 1 from staged row s = tt (LBO 128 B, SBO 1 KB); B: row ρ = r0 + tt from
                    // (P = 2kk, sh = 2) (LBO: the next P, 1 KB; SBO 128 B).
                    const uint64_t da = cbw::desc(a0 + (tt * 2 * AP + 2 * kk) * CI * 16, CI * 16, AP * CI * 16);
                    const uint64_t db = cbw::desc(b0 + ((tt * BP + 2 * kk) * 4 + 2) * 2 * CI * 16, 4 * 2 * CI * 16,
                                                  CI * 16);
                    mma80(d[k], da, db);
                }
                wg_commit();
                cbw::wg_wait<0>();
#pragma unroll
                for (int k = 0; k < KG; ++k) cbw::fence_regs(d[k]);  // no read of d moves above the wait
                if (warp < 3) {  // warp 3: row ρ + 1, a lag of −1, dropped
#pragma unroll
                    for (int k = 0; k < KG; ++k)
#pragma unroll
                        for (int dd = 0; dd < 5; ++dd)
#pragma unroll
                            for (int e = 0; e < 2; ++e) {
                                // register 4·n8 + 2·h + e: n8 = 2·dd + hb (B's plane), h = A's plane (0 hi, 1 lo).
                                // lo·lo (≈ 2^-22 of hi·hi) joins the small terms: every accumulator register must be
                                // read, or ptxas reuses the dead ones and serialises the wgmmas (C7511).
                                sm2[dd][e] += (d[k][4 * (2 * dd + 1) + e] + d[k][4 * (2 * dd) + 2 + e]) +
                                              d[k][4 * (2 * dd + 1) + 2 + e];
                                hh[dd][e] += d[k][4 * (2 * dd) + e];
                            }
                }
            }
        }
        mbar_arrive(bars + 8 * (STAGES + st));  // the stage is free for the producer
#pragma unroll
        for (int dd = 0; dd < 5; ++dd)
#pragma unroll
            for (int e = 0; e < 2; ++e) sd[dd][e] += static_cast<double>(sm2[dd][e]) + static_cast<double>(hh[dd][e]);
    }
    const int i = g, d1 = 2 - warp;
    if (warp < 3 && i < s.C) {
#pragma unroll
        for (int dd = 0; dd < 5; ++dd)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int j = 2 * tq + e;
                if (j < s.C) atomicAdd(acc + cbm::combo(i, j, d1, dd) * cbm::SLOTS, sd[dd][e]);
            }
    }
#endif  // KB_MW
}

inline Shape make_shape(int64_t N, int C, int H, int W) {
    Shape s{static_cast<int>(N), C, H, W, (H + R - 1) / R, (W + TW - 1) / TW, 0};
    const int64_t tiles = N * s.row_tiles * s.col_tiles;
    s.tiles = tiles > INT_MAX ? -1 : static_cast<int>(tiles);
    return s;
}

// acc must hold cbm::ACC_DOUBLES, zeroed (this adds into it). C ≤ 8; an sm_90 GPU and an sm_90a build.
static cudaError_t sums(const float* x, double* acc, int64_t N, int C, int H, int W, int blocks, cudaStream_t stream) {
    const Shape s = make_shape(N, C, H, W);
    if (C < 1 || C > CI || s.tiles < 0) return cudaErrorInvalidValue;
    if (s.tiles == 0) return cudaSuccess;
    cudaError_t err = cudaFuncSetAttribute(moments_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           SMEM_BYTES);
    if (err != cudaSuccess) return err;
    moments_wgmma_kernel<<<blocks < s.tiles ? blocks : s.tiles, THREADS, SMEM_BYTES, stream>>>(x, s, acc);
    return cudaGetLastError();
}

}  // namespace mw
