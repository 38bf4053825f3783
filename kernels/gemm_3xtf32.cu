// gemm_3xtf32.cu — a float32-accurate matrix product on tensor cores: the 3xTF32 split.
//
// TF32 keeps 10 of float32's 23 mantissa bits. Writing each operand as a = a_hi + a_lo, with a_hi = a
// rounded to TF32 and a_lo = (a − a_hi) rounded to TF32, the product is
//     a·b = a_hi·b_hi + a_hi·b_lo + a_lo·b_hi + a_lo·b_lo,
// and the last term is about 2^-22 of the first, under float32's own rounding: three tensor-core
// products, accumulated in float32, give a float32-accurate result.
//
// Tiling (every version): a block computes a BM×BN tile of C from BK-wide slabs of A and B staged in
// shared memory, two stages deep (the next slab loads while this one is used). Each of its 8 warps owns
// a WM×WN tile, i.e. (WM/16)×(WN/8) mma.sync.m16n8k8 tiles, and keeps their accumulators in registers.
// Five versions, each kept so that the book can measure what each change bought:
//   v1  slabs staged raw by cp.async, every fragment split as it is loaded, the three products chained
//       on the accumulator across all of K;
//   v2  as v1, but each 8-deep step's products start from zero and join the accumulator in an FADD;
//   v3  as v2, but every element is split once, as its slab is staged (global → registers → split →
//       shared memory as (hi, lo) pairs), so the inner loop only loads pairs and issues mma;
//   v4  as v3, with the independent steps of a warp's tile interleaved in the order the mma issue;
//   v5  as v4, with hi and lo in separate planes, A's fragments loaded by ldmatrix (one instruction
//       per fragment) and B's by 32-bit loads straight into the registers the mma reads: no moves.
#include "gemm_3xtf32.h"
#include "tf32.cuh"  // split and mma, shared with the tensor-core convolution

#include <cstdint>

namespace {

namespace v12 {  // v1 and v2
constexpr int BM = 128, BN = 128, BK = 32;  // block tile
constexpr int WM = 64, WN = 32;             // warp tile
constexpr int WARPS_M = BM / WM, WARPS_N = BN / WN;
constexpr int THREADS = 32 * WARPS_M * WARPS_N;  // 256
constexpr int MT = WM / 16, NT = WN / 8;         // mma tiles per warp: 4 × 4
constexpr int STAGES = 2;
// Pitches chosen so that a warp's fragment loads hit 32 different banks (see the excerpt's comment).
constexpr int A_PITCH = BK + 4;  // 36 floats: row g starts at bank 4g, column t adds t
constexpr int B_PITCH = BN + 8;  // 136 floats: row t starts at bank 8t, column g adds g
constexpr int A_STAGE = BM * A_PITCH;
constexpr int B_STAGE = BK * B_PITCH;
constexpr int SMEM_BYTES = STAGES * (A_STAGE + B_STAGE) * 4;
static_assert((BM * BK / 4) % THREADS == 0 && (BK * BN / 4) % THREADS == 0, "whole float4s per thread");
}  // namespace v12
using namespace v12;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global → shared, asynchronously; zero-filled when the source is outside the matrix.
// (cp.async and mma.sync need sm_80: an older target compiles them away, and the binding refuses such GPUs.)
__device__ __forceinline__ void copy16(float* dst, const float* src, bool ok) {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(ok ? 16 : 0));
#endif
}

template <int N>
__device__ __forceinline__ void wait_stages() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

__device__ __forceinline__ void stage(float* As, float* Bs, const float* __restrict__ a, const float* __restrict__ b,
                                      int M, int N, int K, int m0, int n0, int k0, int tid) {
#pragma unroll
    for (int i = 0; i < BM * BK / 4 / THREADS; ++i) {  // A: BM rows of BK/4 float4s
        const int v = tid + i * THREADS, r = v / (BK / 4), c = 4 * (v % (BK / 4));
        const bool ok = m0 + r < M && k0 + c < K;
        copy16(As + r * A_PITCH + c, ok ? a + static_cast<int64_t>(m0 + r) * K + k0 + c : a, ok);
    }
#pragma unroll
    for (int i = 0; i < BK * BN / 4 / THREADS; ++i) {  // B: BK rows of BN/4 float4s
        const int v = tid + i * THREADS, r = v / (BN / 4), c = 4 * (v % (BN / 4));
        const bool ok = k0 + r < K && n0 + c < N;
        copy16(Bs + r * B_PITCH + c, ok ? b + static_cast<int64_t>(k0 + r) * N + n0 + c : b, ok);
    }
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}

using kb::mma;    // tf32.cuh
using kb::split;

template <int PASSES, bool CHAINED>
__global__ void __launch_bounds__(THREADS) gemm_tf32_kernel(const float* __restrict__ a,
                                                            const float* __restrict__ b, float* __restrict__ c,
                                                            int M, int N, int K) {
    extern __shared__ __align__(16) float smem[];
    float* As = smem;
    float* Bs = smem + STAGES * A_STAGE;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;  // the mma fragments' row group and thread-in-group
    const int wm = (warp / WARPS_N) * WM, wn = (warp % WARPS_N) * WN;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;

    float acc[MT][NT][4] = {};
    const int tiles = (K + BK - 1) / BK;
    if (tiles > 0) stage(As, Bs, a, b, M, N, K, m0, n0, 0, tid);
    for (int kt = 0; kt < tiles; ++kt) {
        const int cur = kt % STAGES;
        if (kt + 1 < tiles) {
            const int nxt = (kt + 1) % STAGES;
            stage(As + nxt * A_STAGE, Bs + nxt * B_STAGE, a, b, M, N, K, m0, n0, (kt + 1) * BK, tid);
            wait_stages<1>();  // this slab has landed; the next one may still be in flight
        } else {
            wait_stages<0>();
        }
        __syncthreads();
        const float* A = As + cur * A_STAGE;
        const float* B = Bs + cur * B_STAGE;
// excerpt: inner
#pragma unroll
        for (int kk = 0; kk < BK; kk += 8) {
            uint32_t a_hi[MT][4], a_lo[MT][4], b_hi[NT][2], b_lo[NT][2];
#pragma unroll
            for (int i = 0; i < MT; ++i) {  // A fragment: rows g, g+8; columns t, t+4 of a 16×8 tile
                const float* p = A + (wm + 16 * i + g) * A_PITCH + kk + t;
                split(p[0], a_hi[i][0], a_lo[i][0]);
                split(p[8 * A_PITCH], a_hi[i][1], a_lo[i][1]);
                split(p[4], a_hi[i][2], a_lo[i][2]);
                split(p[8 * A_PITCH + 4], a_hi[i][3], a_lo[i][3]);
            }
#pragma unroll
            for (int j = 0; j < NT; ++j) {  // B fragment: rows t, t+4; column g of an 8×8 tile
                const float* p = B + (kk + t) * B_PITCH + wn + 8 * j + g;
                split(p[0], b_hi[j][0], b_lo[j][0]);
                split(p[4 * B_PITCH], b_hi[j][1], b_lo[j][1]);
            }
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                    if (PASSES == 3 && CHAINED) {  // v1: small terms first, all of K in the mma
                        mma(acc[i][j], a_lo[i], b_hi[j]);
                        mma(acc[i][j], a_hi[i], b_lo[j]);
                        mma(acc[i][j], a_hi[i], b_hi[j]);
                    } else if (PASSES == 3) {
                        // Accumulated across all of K inside the mma, the error grows in proportion to K
                        // (5.7e-5 at K = 8192 on an H200, where float32 FFMA errs 1.6e-6): the tensor
                        // cores' additions behave like rounding toward zero. So each 8-deep step's three
                        // products (small terms first) start from zero, and the step joins the
                        // accumulator in a rounded FADD.
                        float step[4] = {0.f, 0.f, 0.f, 0.f};
                        mma(step, a_lo[i], b_hi[j]);
                        mma(step, a_hi[i], b_lo[j]);
                        mma(step, a_hi[i], b_hi[j]);
#pragma unroll
                        for (int r = 0; r < 4; ++r) acc[i][j][r] += step[r];
                    } else {
                        mma(acc[i][j], a_hi[i], b_hi[j]);
                    }
                }
        }
// end excerpt: inner
        __syncthreads();  // the stage just read is the one the next iteration overwrites
    }
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) {  // C fragment: rows g, g+8; columns 2t, 2t+1
            const int r = m0 + wm + 16 * i + g, col = n0 + wn + 8 * j + 2 * t;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int rr = r + 8 * h;
                if (rr >= M) continue;
                if (col < N) c[static_cast<int64_t>(rr) * N + col] = acc[i][j][2 * h];
                if (col + 1 < N) c[static_cast<int64_t>(rr) * N + col + 1] = acc[i][j][2 * h + 1];
            }
        }
}

// ------------------------------------------------------------------------------------------------
// v3: split once, as the slab is staged

namespace v3 {
constexpr int BM = 128, BN = 128, BK = 32, WM = 64, WN = 32;
constexpr int WARPS_N = BN / WN;
constexpr int THREADS = 32 * (BM / WM) * WARPS_N;  // 256
constexpr int MT = WM / 16, NT = WN / 8;
constexpr int STAGES = 2;
// Shared memory holds (hi, lo) pairs, 8 bytes each, read with 64-bit loads: a warp's 64-bit load is
// served half a warp at a time, so the 16 lanes of a half must hit 16 different bank pairs. Lane (g, t)
// of a half reads A pair (g, t) and B pair (t, g); a pitch of 4 (mod 16) pairs puts them at bank pair
// 4g + t and 4t + g: all 16 differ.
constexpr int A_PITCH = BK + 4;  // pairs
constexpr int B_PITCH = BN + 4;
constexpr int A_STAGE = BM * A_PITCH, B_STAGE = BK * B_PITCH;
constexpr int SMEM_BYTES = STAGES * (A_STAGE + B_STAGE) * 8;
constexpr int A_LOADS = BM * BK / 4 / THREADS, B_LOADS = BK * BN / 4 / THREADS;  // float4s per thread
static_assert(A_LOADS * THREADS * 4 == BM * BK && B_LOADS * THREADS * 4 == BK * BN, "whole float4s");
static_assert(A_PITCH % 16 == 4 && B_PITCH % 16 == 4, "conflict-free 64-bit fragment loads");
#ifndef KB_GEMM_KK_UNROLL
#define KB_GEMM_KK_UNROLL 4  // 8-deep steps of a slab unrolled together (1: one at a time, fewer registers)
#endif
constexpr int KK_UNROLL = KB_GEMM_KK_UNROLL;

// The next slab, from global memory into registers (zeros outside the matrices: K, N are multiples of 4).
__device__ __forceinline__ void fetch(float4 (&ra)[A_LOADS], float4 (&rb)[B_LOADS], const float* __restrict__ a,
                                      const float* __restrict__ b, int M, int N, int K, int m0, int n0, int k0,
                                      int tid) {
    const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int i = 0; i < A_LOADS; ++i) {
        const int v = tid + i * THREADS, r = v / (BK / 4), c = 4 * (v % (BK / 4));
        ra[i] = m0 + r < M && k0 + c < K
                    ? __ldg(reinterpret_cast<const float4*>(a + static_cast<int64_t>(m0 + r) * K + k0 + c))
                    : zero;
    }
#pragma unroll
    for (int i = 0; i < B_LOADS; ++i) {
        const int v = tid + i * THREADS, r = v / (BN / 4), c = 4 * (v % (BN / 4));
        rb[i] = k0 + r < K && n0 + c < N
                    ? __ldg(reinterpret_cast<const float4*>(b + static_cast<int64_t>(k0 + r) * N + n0 + c))
                    : zero;
    }
}

// excerpt: stage_split
// Four consecutive floats → four (hi, lo) pairs in shared memory, written as two 16-byte stores.
__device__ __forceinline__ void put_split(uint2* dst, float4 x) {
    uint32_t h[4], l[4];
    split(x.x, h[0], l[0]);
    split(x.y, h[1], l[1]);
    split(x.z, h[2], l[2]);
    split(x.w, h[3], l[3]);
    reinterpret_cast<uint4*>(dst)[0] = make_uint4(h[0], l[0], h[1], l[1]);
    reinterpret_cast<uint4*>(dst)[1] = make_uint4(h[2], l[2], h[3], l[3]);
}
// end excerpt: stage_split

__device__ __forceinline__ void put(uint2* As, uint2* Bs, const float4 (&ra)[A_LOADS], const float4 (&rb)[B_LOADS],
                                    int tid) {
#pragma unroll
    for (int i = 0; i < A_LOADS; ++i) {
        const int v = tid + i * THREADS, r = v / (BK / 4), c = 4 * (v % (BK / 4));
        put_split(As + r * A_PITCH + c, ra[i]);
    }
#pragma unroll
    for (int i = 0; i < B_LOADS; ++i) {
        const int v = tid + i * THREADS, r = v / (BN / 4), c = 4 * (v % (BN / 4));
        put_split(Bs + r * B_PITCH + c, rb[i]);
    }
}

template <int PASSES, bool INTERLEAVE>
__global__ void __launch_bounds__(THREADS, 1) gemm_tf32_v3_kernel(const float* __restrict__ a,
                                                                   const float* __restrict__ b,
                                                                   float* __restrict__ c, int M, int N, int K) {
    extern __shared__ __align__(16) uint2 pairs[];
    uint2* As = pairs;
    uint2* Bs = pairs + STAGES * A_STAGE;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wm = (warp / WARPS_N) * WM, wn = (warp % WARPS_N) * WN;
    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;  // x over M: up to 2^31 - 1 row tiles

    float acc[MT][NT][4] = {};
    float4 ra[A_LOADS], rb[B_LOADS];
    const int tiles = (K + BK - 1) / BK;
    if (tiles > 0) {
        fetch(ra, rb, a, b, M, N, K, m0, n0, 0, tid);
        put(As, Bs, ra, rb, tid);
    }
    __syncthreads();
    for (int kt = 0; kt < tiles; ++kt) {
        const int cur = kt % STAGES;
        if (kt + 1 < tiles) fetch(ra, rb, a, b, M, N, K, m0, n0, (kt + 1) * BK, tid);  // lands during the mma
        const uint2* A = As + cur * A_STAGE;
        const uint2* B = Bs + cur * B_STAGE;
// excerpt: inner_v3
#pragma unroll KK_UNROLL
        for (int kk = 0; kk < BK; kk += 8) {
            uint2 fb[NT][2];  // (hi, lo) pairs, loaded 8 bytes at a time; B's for the whole warp tile,
#pragma unroll                // A's one 16-row tile at a time (fewer live registers)
            for (int j = 0; j < NT; ++j) {
                const uint2* p = B + (kk + t) * B_PITCH + wn + 8 * j + g;
                fb[j][0] = p[0], fb[j][1] = p[4 * B_PITCH];
            }
#pragma unroll
            for (int i = 0; i < MT; ++i) {
                const uint2* p = A + (wm + 16 * i + g) * A_PITCH + kk + t;
                const uint2 fa[4] = {p[0], p[8 * A_PITCH], p[4], p[8 * A_PITCH + 4]};
                const uint32_t a_hi[4] = {fa[0].x, fa[1].x, fa[2].x, fa[3].x};
                const uint32_t a_lo[4] = {fa[0].y, fa[1].y, fa[2].y, fa[3].y};
                uint32_t b_hi[NT][2], b_lo[NT][2];
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                    b_hi[j][0] = fb[j][0].x, b_hi[j][1] = fb[j][1].x;
                    b_lo[j][0] = fb[j][0].y, b_lo[j][1] = fb[j][1].y;
                }
                if (PASSES == 1) {
#pragma unroll
                    for (int j = 0; j < NT; ++j) mma(acc[i][j], a_hi, b_hi[j]);
                } else if (INTERLEAVE) {
                    // v4: the NT independent steps advance together, one pass at a time. A warp issues
                    // in program order and waits at an mma whose accumulator is still being computed:
                    // in v2/v3's order (three passes of one step, then the next step) every mma waits
                    // for the one before it; here NT - 1 others issue in between.
                    float step[NT][4] = {};
#pragma unroll
                    for (int j = 0; j < NT; ++j) mma(step[j], a_lo, b_hi[j]);
#pragma unroll
                    for (int j = 0; j < NT; ++j) mma(step[j], a_hi, b_lo[j]);
#pragma unroll
                    for (int j = 0; j < NT; ++j) mma(step[j], a_hi, b_hi[j]);
#pragma unroll
                    for (int j = 0; j < NT; ++j)
#pragma unroll
                        for (int r = 0; r < 4; ++r) acc[i][j][r] += step[j][r];
                } else {  // v3: as v2, each step from zero, its three passes in a row, then an FADD
#pragma unroll
                    for (int j = 0; j < NT; ++j) {
                        float step[4] = {0.f, 0.f, 0.f, 0.f};
                        mma(step, a_lo, b_hi[j]);
                        mma(step, a_hi, b_lo[j]);
                        mma(step, a_hi, b_hi[j]);
#pragma unroll
                        for (int r = 0; r < 4; ++r) acc[i][j][r] += step[r];
                    }
                }
            }
        }
// end excerpt: inner_v3
        if (kt + 1 < tiles) put(As + (cur ^ 1) * A_STAGE, Bs + (cur ^ 1) * B_STAGE, ra, rb, tid);
        __syncthreads();  // the next slab is in place, and no warp still reads the one it replaced
    }
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const int r = m0 + wm + 16 * i + g, col = n0 + wn + 8 * j + 2 * t;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int rr = r + 8 * h;
                if (rr >= M) continue;
                if (col < N) c[static_cast<int64_t>(rr) * N + col] = acc[i][j][2 * h];
                if (col + 1 < N) c[static_cast<int64_t>(rr) * N + col + 1] = acc[i][j][2 * h + 1];
            }
        }
}
}  // namespace v3

// ------------------------------------------------------------------------------------------------
// v5: hi and lo in planes of their own, A's fragments by ldmatrix

namespace v5 {
using v3::BK;
using v3::BM;
using v3::BN;
using v3::MT;
using v3::NT;
using v3::STAGES;
using v3::THREADS;
using v3::WARPS_N;
using v3::WM;
using v3::WN;
// One plane per part (hi, lo) and operand, 4-byte words. A rows are 36 words apart: ldmatrix reads 8
// rows of 16 bytes per matrix, at banks 4r..4r+3 — all 32 banks once. B as v2 (see its pitch).
constexpr int A_PITCH = BK + 4, B_PITCH = BN + 8;
constexpr int A_PLANE = BM * A_PITCH, B_PLANE = BK * B_PITCH;
constexpr int STAGE = 2 * A_PLANE + 2 * B_PLANE;  // A hi, A lo, B hi, B lo
constexpr int SMEM_BYTES = STAGES * STAGE * 4;

__device__ __forceinline__ void put4(uint32_t* hi, uint32_t* lo, float4 x) {
    uint32_t h[4], l[4];
    split(x.x, h[0], l[0]);
    split(x.y, h[1], l[1]);
    split(x.z, h[2], l[2]);
    split(x.w, h[3], l[3]);
    *reinterpret_cast<uint4*>(hi) = make_uint4(h[0], h[1], h[2], h[3]);
    *reinterpret_cast<uint4*>(lo) = make_uint4(l[0], l[1], l[2], l[3]);
}

__device__ __forceinline__ void put(uint32_t* stage, const float4 (&ra)[v3::A_LOADS], const float4 (&rb)[v3::B_LOADS],
                                    int tid) {
#pragma unroll
    for (int i = 0; i < v3::A_LOADS; ++i) {
        const int v = tid + i * THREADS, r = v / (BK / 4), c = 4 * (v % (BK / 4));
        put4(stage + r * A_PITCH + c, stage + A_PLANE + r * A_PITCH + c, ra[i]);
    }
#pragma unroll
    for (int i = 0; i < v3::B_LOADS; ++i) {
        const int v = tid + i * THREADS, r = v / (BN / 4), c = 4 * (v % (BN / 4));
        put4(stage + 2 * A_PLANE + r * B_PITCH + c, stage + 2 * A_PLANE + B_PLANE + r * B_PITCH + c, rb[i]);
    }
}

// excerpt: ldmatrix
// The whole 16×8 A fragment in one instruction: lanes 8q..8q+7 name the rows of 8×(16-byte) matrix q
// (rows 0–7 and 8–15 of columns 0–3, then of columns 4–7), and each lane receives a0..a3 exactly as
// mma.sync.m16n8k8's TF32 A operand wants them (ldmatrix moves 16-bit pairs; a TF32 is two of them).
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const uint32_t* tile, int lane) {
    const uint32_t* row = tile + ((lane & 7) + 8 * ((lane >> 3) & 1)) * A_PITCH + 4 * (lane >> 4);
#if __CUDA_ARCH__ >= 800
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
                 : "r"(smem_addr(row)));
#else
    a[0] = a[1] = a[2] = a[3] = row[0];
#endif
}
// end excerpt: ldmatrix

template <int PASSES>
__global__ void __launch_bounds__(THREADS, 1) gemm_tf32_v5_kernel(const float* __restrict__ a,
                                                                   const float* __restrict__ b,
                                                                   float* __restrict__ c, int M, int N, int K) {
    extern __shared__ __align__(16) uint32_t words[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wm = (warp / WARPS_N) * WM, wn = (warp % WARPS_N) * WN;
    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;

    float acc[MT][NT][4] = {};
    float4 ra[v3::A_LOADS], rb[v3::B_LOADS];
    const int tiles = (K + BK - 1) / BK;
    if (tiles > 0) {
        v3::fetch(ra, rb, a, b, M, N, K, m0, n0, 0, tid);
        put(words, ra, rb, tid);
    }
    __syncthreads();
    for (int kt = 0; kt < tiles; ++kt) {
        const int cur = kt % STAGES;
        if (kt + 1 < tiles) v3::fetch(ra, rb, a, b, M, N, K, m0, n0, (kt + 1) * BK, tid);
        const uint32_t* A_hi = words + cur * STAGE;
        const uint32_t* A_lo = A_hi + A_PLANE;
        const uint32_t* B_hi = A_hi + 2 * A_PLANE;
        const uint32_t* B_lo = B_hi + B_PLANE;
// excerpt: inner_v5
#pragma unroll 2
        for (int kk = 0; kk < BK; kk += 8) {
            uint32_t b_hi[NT][2], b_lo[NT][2];
#pragma unroll
            for (int j = 0; j < NT; ++j) {  // B fragment: rows t, t+4; column g of an 8×8 tile
                const int o = (kk + t) * B_PITCH + wn + 8 * j + g;
                b_hi[j][0] = B_hi[o], b_hi[j][1] = B_hi[o + 4 * B_PITCH];
                b_lo[j][0] = B_lo[o], b_lo[j][1] = B_lo[o + 4 * B_PITCH];
            }
#pragma unroll
            for (int i = 0; i < MT; ++i) {
                uint32_t a_hi[4], a_lo[4];
                load_a(a_hi, A_hi + (wm + 16 * i) * A_PITCH + kk, lane);
                if (PASSES == 1) {
#pragma unroll
                    for (int j = 0; j < NT; ++j) mma(acc[i][j], a_hi, b_hi[j]);
                    continue;
                }
                load_a(a_lo, A_lo + (wm + 16 * i) * A_PITCH + kk, lane);
                float step[NT][4] = {};  // as v4: the NT steps advance together, one pass at a time
#pragma unroll
                for (int j = 0; j < NT; ++j) mma(step[j], a_lo, b_hi[j]);
#pragma unroll
                for (int j = 0; j < NT; ++j) mma(step[j], a_hi, b_lo[j]);
#pragma unroll
                for (int j = 0; j < NT; ++j) mma(step[j], a_hi, b_hi[j]);
#pragma unroll
                for (int j = 0; j < NT; ++j)
#pragma unroll
                    for (int r = 0; r < 4; ++r) acc[i][j][r] += step[j][r];
            }
        }
// end excerpt: inner_v5
        if (kt + 1 < tiles) put(words + (cur ^ 1) * STAGE, ra, rb, tid);
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const int r = m0 + wm + 16 * i + g, col = n0 + wn + 8 * j + 2 * t;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int rr = r + 8 * h;
                if (rr >= M) continue;
                if (col < N) c[static_cast<int64_t>(rr) * N + col] = acc[i][j][2 * h];
                if (col + 1 < N) c[static_cast<int64_t>(rr) * N + col + 1] = acc[i][j][2 * h + 1];
            }
        }
}
}  // namespace v5

// ------------------------------------------------------------------------------------------------
// The tensor cores' own rate through mma.sync: independent chains of m16n8k8 TF32 products on
// register operands, nothing loaded or stored in the loop (the ceiling the GEMMs are held against).

constexpr int PEAK_CHAINS = 8, PEAK_THREADS = 256;

__global__ void __launch_bounds__(PEAK_THREADS) mma_peak_kernel(float* out, int iters) {
    uint32_t a[4], b[2];
    const float x = 1.0f + 1e-3f * static_cast<float>(threadIdx.x & 31);
#pragma unroll
    for (int r = 0; r < 4; ++r) a[r] = __float_as_uint(x + static_cast<float>(r));
    b[0] = __float_as_uint(0.5f), b[1] = __float_as_uint(0.25f);
    float acc[PEAK_CHAINS][4] = {};
    for (int it = 0; it < iters; ++it)
#pragma unroll
        for (int u = 0; u < PEAK_CHAINS; ++u) mma(acc[u], a, b);
    float s = 0.f;
#pragma unroll
    for (int u = 0; u < PEAK_CHAINS; ++u) s += acc[u][0] + acc[u][1] + acc[u][2] + acc[u][3];
    out[static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x] = s;
}

template <int PASSES, bool CHAINED>
cudaError_t launch_v12(const float* a, const float* b, float* c, int M, int N, int K, cudaStream_t stream) {
    if ((M + BM - 1) / BM > 65535) return cudaErrorInvalidConfiguration;  // grid.y holds the row tiles
    cudaError_t err = cudaFuncSetAttribute(gemm_tf32_kernel<PASSES, CHAINED>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES);
    if (err != cudaSuccess) return err;
    const dim3 grid((N + BN - 1) / BN, (M + BM - 1) / BM);
    gemm_tf32_kernel<PASSES, CHAINED><<<grid, THREADS, SMEM_BYTES, stream>>>(a, b, c, M, N, K);
    return cudaGetLastError();
}

template <int PASSES, bool INTERLEAVE>
cudaError_t launch_v3(const float* a, const float* b, float* c, int M, int N, int K, cudaStream_t stream) {
    if ((N + v3::BN - 1) / v3::BN > 65535) return cudaErrorInvalidConfiguration;  // grid.y: column tiles
    cudaError_t err = cudaFuncSetAttribute(v3::gemm_tf32_v3_kernel<PASSES, INTERLEAVE>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, v3::SMEM_BYTES);
    if (err != cudaSuccess) return err;
    const dim3 grid((M + v3::BM - 1) / v3::BM, (N + v3::BN - 1) / v3::BN);
    v3::gemm_tf32_v3_kernel<PASSES, INTERLEAVE><<<grid, v3::THREADS, v3::SMEM_BYTES, stream>>>(a, b, c, M, N, K);
    return cudaGetLastError();
}

}  // namespace

template <int PASSES>
cudaError_t launch_v5(const float* a, const float* b, float* c, int M, int N, int K, cudaStream_t stream) {
    if ((N + v5::BN - 1) / v5::BN > 65535) return cudaErrorInvalidConfiguration;
    cudaError_t err = cudaFuncSetAttribute(v5::gemm_tf32_v5_kernel<PASSES>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, v5::SMEM_BYTES);
    if (err != cudaSuccess) return err;
    const dim3 grid((M + v5::BM - 1) / v5::BM, (N + v5::BN - 1) / v5::BN);
    v5::gemm_tf32_v5_kernel<PASSES><<<grid, v5::THREADS, v5::SMEM_BYTES, stream>>>(a, b, c, M, N, K);
    return cudaGetLastError();
}

cudaError_t launch_gemm_tf32(const float* a, const float* b, float* c, int M, int N, int K, int passes,
                             int version, cudaStream_t stream) {
    if ((passes != 1 && passes != 3) || version < 1 || version > 5) return cudaErrorInvalidValue;
    if (M == 0 || N == 0) return cudaSuccess;
    if (passes == 1 && (version == 3 || version == 4)) return launch_v3<1, false>(a, b, c, M, N, K, stream);
    if (version == 3) return launch_v3<3, false>(a, b, c, M, N, K, stream);
    if (version == 4) return launch_v3<3, true>(a, b, c, M, N, K, stream);
    if (version == 5) return passes == 3 ? launch_v5<3>(a, b, c, M, N, K, stream) : launch_v5<1>(a, b, c, M, N, K, stream);
    if (passes == 1) return launch_v12<1, false>(a, b, c, M, N, K, stream);
    return version == 1 ? launch_v12<3, true>(a, b, c, M, N, K, stream) : launch_v12<3, false>(a, b, c, M, N, K, stream);
}

GemmTf32Config gemm_tf32_config(int version) {
    if (version == 5)
        return {v5::BM, v5::BN, v5::BK, v5::WM, v5::WN, v5::THREADS, v5::STAGES, v5::SMEM_BYTES};
    if (version >= 3)
        return {v3::BM, v3::BN, v3::BK, v3::WM, v3::WN, v3::THREADS, v3::STAGES, v3::SMEM_BYTES};
    return {BM, BN, BK, WM, WN, THREADS, STAGES, SMEM_BYTES};
}

cudaError_t launch_mma_peak(float* out, int blocks, int iters, cudaStream_t stream) {
    if (blocks <= 0 || iters < 0) return cudaErrorInvalidValue;
    mma_peak_kernel<<<blocks, PEAK_THREADS, 0, stream>>>(out, iters);
    return cudaGetLastError();
}

MmaPeakConfig mma_peak_config() { return {PEAK_THREADS, PEAK_CHAINS, 16 * 8 * 8}; }
