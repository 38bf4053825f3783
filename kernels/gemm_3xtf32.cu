// gemm_3xtf32.cu — a float32-accurate matrix product on tensor cores: the 3xTF32 split.
//
// TF32 keeps 10 of float32's 23 mantissa bits. Writing each operand as a = a_hi + a_lo, with a_hi = a
// rounded to TF32 and a_lo = (a − a_hi) rounded to TF32, the product is
//     a·b = a_hi·b_hi + a_hi·b_lo + a_lo·b_hi + a_lo·b_lo,
// and the last term is about 2^-22 of the first, under float32's own rounding: three tensor-core
// products, accumulated in float32, give a float32-accurate result.
//
// Tiling: a block computes a BM×BN tile of C from BK-wide slabs of A and B staged in shared memory by
// cp.async (two stages: the next slab loads while this one is used). Each of its 8 warps owns a WM×WN
// tile, i.e. (WM/16)×(WN/8) mma.sync.m16n8k8 tiles, and keeps their accumulators in registers.
#include "gemm_3xtf32.h"

#include <cstdint>

namespace {

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

// excerpt: split
// x = hi + lo, both TF32 (hi: x rounded to nearest TF32; lo: the remainder, rounded again).
__device__ __forceinline__ void split(float x, uint32_t& hi, uint32_t& lo) {
#if __CUDA_ARCH__ >= 800
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(hi) : "f"(x));
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(lo) : "f"(x - __uint_as_float(hi)));
#else
    hi = __float_as_uint(x), lo = 0u;
#endif
}

// acc += a·b for one 16×8×8 tile on the tensor cores (TF32 inputs, float32 accumulation).
__device__ __forceinline__ void mma(float (&acc)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}
// end excerpt: split

template <int PASSES>
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
                    if (PASSES == 3) {
                        // The tensor cores round their sums toward zero: accumulated across all of K in
                        // the mma, that bias grows with K (5.7e-5 at K = 8192 on an H200, where float32
                        // FFMA errs 1.6e-6). So each 8-deep step's three products (small terms first)
                        // start from zero, and the step joins the accumulator in a rounded FADD.
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

template <int PASSES>
cudaError_t launch(const float* a, const float* b, float* c, int M, int N, int K, cudaStream_t stream) {
    cudaError_t err = cudaFuncSetAttribute(gemm_tf32_kernel<PASSES>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           SMEM_BYTES);
    if (err != cudaSuccess) return err;
    const dim3 grid((N + BN - 1) / BN, (M + BM - 1) / BM);
    gemm_tf32_kernel<PASSES><<<grid, THREADS, SMEM_BYTES, stream>>>(a, b, c, M, N, K);
    return cudaGetLastError();
}

}  // namespace

cudaError_t launch_gemm_tf32(const float* a, const float* b, float* c, int M, int N, int K, int passes,
                             cudaStream_t stream) {
    if (M == 0 || N == 0) return cudaSuccess;
    if (passes == 3) return launch<3>(a, b, c, M, N, K, stream);
    if (passes == 1) return launch<1>(a, b, c, M, N, K, stream);
    return cudaErrorInvalidValue;
}

void gemm_tf32_config(int* bm, int* bn, int* bk, int* wm, int* wn, int* threads, int* stages, int* smem_bytes) {
    *bm = BM, *bn = BN, *bk = BK, *wm = WM, *wn = WN, *threads = THREADS, *stages = STAGES,
    *smem_bytes = SMEM_BYTES;
}
