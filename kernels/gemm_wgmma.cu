// gemm_wgmma.cu — C = A·B in 3xTF32 (or TF32) through Hopper's own path: the bulk tensor copy engine (TMA) fills
// a ring of shared-memory stages, one producer warpgroup issues the copies, two consumer warpgroups issue
// warpgroup MMAs (wgmma.mma_async) that read both operands straight from shared memory. The wgmma code exists
// only in an sm_90a build (__CUDA_ARCH_FEAT_SM90_ALL); other targets compile empty kernels, which the
// binding never launches (gemm_wgmma_built() says which binary was loaded).
#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstdint>

#include "gemm_wgmma.h"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KB_WGMMA 1
#endif

namespace {

constexpr int kBM = 128, kBN = 128;  // block tile: two consumer warpgroups of 64 rows × 128 columns each
constexpr int kBK = 32;              // 32 floats = 128 bytes of K per row: one row of the 128-byte swizzle
constexpr int kPlaneBytes = kBM * kBK * 4;  // one 128×32 float tile (BM = BN): 16 KiB
constexpr int kThreads = 384;        // warpgroup 0 copies, warpgroups 1 and 2 multiply
constexpr int kConsumerThreads = 256;

__device__ int g_wgmma_built =
#ifdef KB_WGMMA
    1;
#else
    0;
#endif

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// excerpt: split_planes
// x = hi + lo with both parts TF32 (hi = x to the nearest TF32, ties away; lo = x − hi, rounded the same way).
__device__ __forceinline__ void split_tf32(float x, float& hi, float& lo) {
#if __CUDA_ARCH__ >= 800
    uint32_t h, l;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(h) : "f"(x));
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(l) : "f"(x - __uint_as_float(h)));
    hi = __uint_as_float(h), lo = __uint_as_float(l);
#else
    hi = x, lo = 0.f;
#endif
}

// Planes [R × Kp], K fastest, from x: x[r][k] (x is R × K) or, with kTranspose, x[k][r] (x is K × R).
// A 32×32 tile per block of 32×8 threads; the transpose goes through shared memory so that both the reads
// and the writes are coalesced. Columns K ≤ k < Kp are written as zeros.
template <bool kTranspose>
__global__ void __launch_bounds__(256) split_planes(const float* __restrict__ x, int R, int K, int Kp,
                                                    float* __restrict__ hi, float* __restrict__ lo) {
    __shared__ float tile[32][33];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int k0 = blockIdx.x * 32;
    for (int r0 = blockIdx.y * 32; r0 < R; r0 += gridDim.y * 32) {
        if (kTranspose) {
            __syncthreads();
            for (int i = ty; i < 32; i += 8) {  // read x[k0 + i][r0 + tx]: consecutive r across the warp
                const int k = k0 + i, r = r0 + tx;
                tile[i][tx] = (k < K && r < R) ? x[static_cast<size_t>(k) * R + r] : 0.f;
            }
            __syncthreads();
        }
        for (int i = ty; i < 32; i += 8) {  // write plane[r0 + i][k0 + tx]: consecutive k across the warp
            const int r = r0 + i, k = k0 + tx;
            if (r >= R || k >= Kp) continue;
            const float v = kTranspose ? tile[tx][i] : (k < K ? x[static_cast<size_t>(r) * K + k] : 0.f);
            float h, l;
            split_tf32(v, h, l);
            const size_t at = static_cast<size_t>(r) * Kp + k;
            hi[at] = h, lo[at] = l;
        }
    }
}
// end excerpt: split_planes

#ifdef KB_WGMMA
// ---- the copy engine and its barriers (PTX ISA: mbarrier, cp.async.bulk.tensor) ----
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Waits until the barrier's phase of this parity has completed (a fresh barrier counts parity 1 as done).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done = 0;
    while (!done)
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done) : "r"(bar), "r"(parity) : "memory");
}
// One box of the tensor map (x = K coordinate, y = row) into shared memory; completes bytes on `bar`.
__device__ __forceinline__ void tma_load(const CUtensorMap* map, uint32_t dst, uint32_t bar, int x, int y) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n"
        ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(x), "r"(y) : "memory");
}

// ---- warpgroup MMA (PTX ISA: wgmma) ----
// excerpt: descriptor
// A shared-memory matrix descriptor for a K-major tile in the 128-byte swizzle the copy engine writes: rows
// of 128 bytes (32 floats of K), 8 rows (1024 bytes) per swizzle atom. Start address and the stride from one
// 8-row atom to the next (1024 B) are stored divided by 16; bits 62–63 = 1 select the 128-byte swizzle; the
// leading offset is unused in this layout (1 by convention). Stepping k by 8 floats adds 32 bytes (2 units)
// to the start address: the hardware applies the swizzle to the address it computes.
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr) {
    return static_cast<uint64_t>((addr & 0x3ffff) >> 4) | (1ull << 16) | (static_cast<uint64_t>(1024 >> 4) << 32) |
           (1ull << 62);
}
// end excerpt: descriptor

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Keeps the compiler from moving reads or writes of an accumulator across a wgmma wait.
template <int kN>
__device__ __forceinline__ void fence_regs(float (&d)[kN]) {
#pragma unroll
    for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

#define KB_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
                 "+f"(d[i + 6]), "+f"(d[i + 7])
#define KB_R10(b) "%" #b "0, %" #b "1, %" #b "2, %" #b "3, %" #b "4, %" #b "5, %" #b "6, %" #b "7, %" #b "8, " \
                  "%" #b "9"

// excerpt: wgmma
// d[64×128] (+)= a[64×8] · b[8×128]ᵀ, both from shared memory, TF32 in, float32 accumulate. `accumulate` = 0
// starts d from zero (scale-d). Thread t of the warpgroup holds rows 16·(t/32) + (t%32)/4 (+8) and columns
// 8j + 2·(t%4) (+1) of d, j = 0…15, as d[4j … 4j+3].
__device__ __forceinline__ void wgmma_n128(float (&d)[64], uint64_t da, uint64_t db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, " KB_R10(1) ", " KB_R10(2) ", " KB_R10(3) ", " KB_R10(4) ", "
        KB_R10(5) ", %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}\n"
        : KB_D8(0), KB_D8(8), KB_D8(16), KB_D8(24), KB_D8(32), KB_D8(40), KB_D8(48), KB_D8(56)
        : "l"(da), "l"(db), "r"(accumulate));
}
// end excerpt: wgmma

// The same product 64×256 wide, for the ceiling (d holds 128 floats per thread).
__device__ __forceinline__ void wgmma_n256(float (&d)[128], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, " KB_R10(1) ", " KB_R10(2) ", " KB_R10(3) ", " KB_R10(4) ", "
        KB_R10(5) ", " KB_R10(6) ", " KB_R10(7) ", " KB_R10(8) ", " KB_R10(9) ", " KB_R10(10) ", " KB_R10(11) ", "
        "%120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1;\n}\n"
        : KB_D8(0), KB_D8(8), KB_D8(16), KB_D8(24), KB_D8(32), KB_D8(40), KB_D8(48), KB_D8(56), KB_D8(64),
          KB_D8(72), KB_D8(80), KB_D8(88), KB_D8(96), KB_D8(104), KB_D8(112), KB_D8(120)
        : "l"(da), "l"(db), "r"(1));
}
#endif  // KB_WGMMA

// Shared memory of one stage: the planes in the order A_hi, B_hi, A_lo, B_lo (passes = 1 keeps the first two);
// 3 stages of 64 KiB or 6 of 32 KiB fit the 227 KiB a block may have; + 1 KiB to align the first to 1024 bytes.
template <int kPasses>
struct Stage {
    static constexpr int kPlanes = kPasses == 3 ? 4 : 2;
    static constexpr int kBytes = kPlanes * kPlaneBytes;
    static constexpr int kCount = kPasses == 3 ? 3 : 6;
    static constexpr int kSmem = kCount * kBytes + 2 * kCount * 8 + 1024;  // + the full and empty barriers
};

// excerpt: consumer
#ifdef KB_WGMMA
// One consumer warpgroup's products for one stage: 4 steps of k8, each 3 products (or 1) into d.
template <int kPasses>
__device__ __forceinline__ void issue_slab(float (&d)[64], uint32_t stage, int row0, bool fresh) {
    const uint32_t a_hi = stage + row0 * 128, b_hi = stage + kPlaneBytes;
    const uint32_t a_lo = a_hi + 2 * kPlaneBytes, b_lo = b_hi + 2 * kPlaneBytes;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBK / 8; ++kk) {
        const int first = fresh && kk == 0 ? 0 : 1;  // scale-d = 0 on the slab's first product: d starts at 0
        if (kPasses == 3) {  // the small terms first, so that the largest meets an accumulator of its size
            wgmma_n128(d, smem_desc(a_lo + 32 * kk), smem_desc(b_hi + 32 * kk), first);
            wgmma_n128(d, smem_desc(a_hi + 32 * kk), smem_desc(b_lo + 32 * kk), 1);
            wgmma_n128(d, smem_desc(a_hi + 32 * kk), smem_desc(b_hi + 32 * kk), 1);
        } else {
            wgmma_n128(d, smem_desc(a_hi + 32 * kk), smem_desc(b_hi + 32 * kk), first);
        }
    }
    wgmma_commit();
}

__device__ __forceinline__ void add_into(float (&acc)[64], float (&t)[64]) {
    fence_regs(t);
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] += t[i];
}
#endif
// end excerpt: consumer

template <int kPasses, int kVersion>
__global__ void __launch_bounds__(kThreads, 1)
gemm_wgmma_kernel(const __grid_constant__ CUtensorMap map_a_hi, const __grid_constant__ CUtensorMap map_b_hi,
                  const __grid_constant__ CUtensorMap map_a_lo, const __grid_constant__ CUtensorMap map_b_lo,
                  float* __restrict__ c, int M, int N, int Kp) {
#ifdef KB_WGMMA
    constexpr int S = Stage<kPasses>::kCount;
    constexpr int kStageBytes = Stage<kPasses>::kBytes;
    extern __shared__ unsigned char smem_raw[];
    const uint32_t raw = smem_u32(smem_raw);
    const uint32_t base = (raw + 1023) & ~1023u;  // the 128-byte swizzle needs 1024-byte-aligned tiles
    const uint32_t bars = base + S * kStageBytes;  // full[S] then empty[S], 8 bytes each
    const int m0 = blockIdx.y * kBM, n0 = blockIdx.x * kBN;
    const int KT = (Kp + kBK - 1) / kBK;
    const int wg = threadIdx.x / 128;
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; ++s) {
            mbar_init(bars + 8 * s, 1);                       // full: the producer's arrive + the copy's bytes
            mbar_init(bars + 8 * (S + s), kConsumerThreads);  // empty: every consumer thread has read it
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    // excerpt: producer
    if (wg == 0) {  // the producer: one thread keeps the copy engine S stages ahead of the consumers
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (threadIdx.x == 0) {
            for (int kt = 0; kt < KT; ++kt) {
                const int s = kt % S;
                const uint32_t parity = (kt / S) & 1;
                mbar_wait(bars + 8 * (S + s), parity ^ 1);  // the consumers released this stage
                const uint32_t st = base + s * kStageBytes, full = bars + 8 * s;
                mbar_expect_tx(full, kStageBytes);
                tma_load(&map_a_hi, st, full, kt * kBK, m0);
                tma_load(&map_b_hi, st + kPlaneBytes, full, kt * kBK, n0);
                if (kPasses == 3) {
                    tma_load(&map_a_lo, st + 2 * kPlaneBytes, full, kt * kBK, m0);
                    tma_load(&map_b_lo, st + 3 * kPlaneBytes, full, kt * kBK, n0);
                }
            }
        }
        return;
    }
    // end excerpt: producer
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    const int cw = wg - 1, row0 = cw * 64;  // this warpgroup's 64 rows of the block tile
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.f;
    auto stage_at = [&](int kt) { return base + (kt % S) * kStageBytes; };
    auto wait_full = [&](int kt) { mbar_wait(bars + 8 * (kt % S), (kt / S) & 1); };
    auto release = [&](int kt) { mbar_arrive(bars + 8 * (S + kt % S)); };
    // excerpt: mainloop
    if (kVersion == 1) {  // chained: every product of all of K into acc; one stage of products kept in flight
        for (int kt = 0; kt < KT; ++kt) {
            wait_full(kt);
            issue_slab<kPasses>(acc, stage_at(kt), row0, false);
            wgmma_wait<1>();  // the previous stage's products are done: its tiles may be overwritten
            if (kt > 0) release(kt - 1);
        }
        wgmma_wait<0>();
        fence_regs(acc);
        release(KT - 1);
    } else {  // staged: slab kt into t0 or t1 (alternating), added to acc once its products are done
        float t0[64], t1[64];
        wait_full(0);
        issue_slab<kPasses>(t0, stage_at(0), row0, true);
        for (int kt = 0; kt < KT; kt += 2) {
            // t0 holds slab kt, in flight
            if (kt + 1 < KT) {
                wait_full(kt + 1);
                issue_slab<kPasses>(t1, stage_at(kt + 1), row0, true);
                wgmma_wait<1>();
            } else {
                wgmma_wait<0>();
            }
            add_into(acc, t0);
            release(kt);
            if (kt + 1 >= KT) break;
            // t1 holds slab kt + 1, in flight
            if (kt + 2 < KT) {
                wait_full(kt + 2);
                issue_slab<kPasses>(t0, stage_at(kt + 2), row0, true);
                wgmma_wait<1>();
            } else {
                wgmma_wait<0>();
            }
            add_into(acc, t1);
            release(kt + 1);
        }
    }
    // end excerpt: mainloop

    // The epilogue: each thread's 64 values straight to C (two neighbouring columns per store).
    const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
    const int r_lo = m0 + row0 + 16 * warp + lane / 4;
    const bool pairs = (N % 2) == 0;
#pragma unroll
    for (int j = 0; j < kBN / 8; ++j) {
        const int col = n0 + 8 * j + 2 * (lane % 4);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = r_lo + 8 * h;
            if (r >= M || col >= N) continue;
            float* p = c + static_cast<size_t>(r) * N + col;
            if (pairs) {
                *reinterpret_cast<float2*>(p) = make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
            } else {
                p[0] = acc[4 * j + 2 * h];
                if (col + 1 < N) p[1] = acc[4 * j + 2 * h + 1];
            }
        }
    }
#endif  // KB_WGMMA
}

// excerpt: ceiling
// The ceiling: each warpgroup multiplies its own 64×32 and 256×32 shared-memory tiles of random TF32 values,
// stepping through the four k8 slices, into one 64×256 accumulator. No memory traffic, no other instructions.
__global__ void __launch_bounds__(kWgmmaCeilingThreads)
wgmma_ceiling_kernel(const unsigned* __restrict__ seeds, float* __restrict__ out, long long* __restrict__ clocks,
                     int iters) {
#ifdef KB_WGMMA
    constexpr int kA = 64 * kBK * 4, kB = kWgmmaCeilingN * kBK * 4;  // 8 KiB and 32 KiB per warpgroup
    extern __shared__ unsigned char smem_raw[];
    const uint32_t base = (smem_u32(smem_raw) + 1023) & ~1023u;
    unsigned char* gbase = smem_raw + (base - smem_u32(smem_raw));
    const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
    const uint32_t a = base + wg * (kA + kB), b = a + kA;
    uint32_t* words = reinterpret_cast<uint32_t*>(gbase + wg * (kA + kB));
    uint32_t x = seeds[threadIdx.x] | 1u;
    for (int i = t; i < (kA + kB) / 4; i += 128) {  // random mantissas, exponent of [1, 2): no overflow
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        words[i] = (x & 0x007fe000u) | 0x3f800000u;
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // ordinary stores, read by the tensor cores
    __syncthreads();
    float d[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) d[i] = 0.f;
    unsigned long long ns0 = 0, ns1 = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns0));
    const long long cycles0 = clock64();
    for (int it = 0; it < iters; ++it) {
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBK / 8; ++kk) wgmma_n256(d, smem_desc(a + 32 * kk), smem_desc(b + 32 * kk));
        wgmma_commit();
        wgmma_wait<1>();
    }
    wgmma_wait<0>();
    fence_regs(d);
    const long long cycles1 = clock64();
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns1));
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < 128; ++i) sum += d[i];
    out[static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x] = sum;
    if (clocks != nullptr && threadIdx.x == 0) {
        clocks[2 * blockIdx.x] = cycles1 - cycles0;
        clocks[2 * blockIdx.x + 1] = static_cast<long long>(ns1 - ns0);
    }
#endif
}
// end excerpt: ceiling

constexpr int kCeilingSmem = 2 * (64 + kWgmmaCeilingN) * kBK * 4 + 1024;

// ---- host side ----
int round_up4(int k) { return (k + 3) / 4 * 4; }

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
    if (fn == nullptr) {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult q{};
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) ==
                cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    }
    return fn;
}

// A plane [rows × Kp] floats, copied in boxes of 32 (K) × 128 rows with the 128-byte swizzle, zeros past edges.
bool plane_map(CUtensorMap* map, const float* plane, int rows, int Kp) {
    auto encode = encode_fn();
    if (encode == nullptr) return false;
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(Kp), static_cast<cuuint64_t>(rows)};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(Kp) * 4};
    const cuuint32_t box[2] = {kBK, kBM};
    const cuuint32_t elem[2] = {1, 1};
    return encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, const_cast<float*>(plane), dims, strides, box, elem,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <bool kTranspose>
cudaError_t split(const float* x, int R, int K, int Kp, float* hi, float* lo, cudaStream_t stream) {
    const int row_tiles = (R + 31) / 32;
    const dim3 grid((Kp + 31) / 32, row_tiles < 65535 ? row_tiles : 65535);
    split_planes<kTranspose><<<grid, dim3(32, 8), 0, stream>>>(x, R, K, Kp, hi, lo);
    return cudaGetLastError();
}

template <int kPasses, int kVersion>
cudaError_t launch(const CUtensorMap (&maps)[4], float* c, int M, int N, int Kp, cudaStream_t stream) {
    auto kernel = gemm_wgmma_kernel<kPasses, kVersion>;
    constexpr int smem = Stage<kPasses>::kSmem;
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
    const dim3 grid((N + kBN - 1) / kBN, (M + kBM - 1) / kBM);
    kernel<<<grid, kThreads, smem, stream>>>(maps[0], maps[1], maps[2], maps[3], c, M, N, Kp);
    return cudaGetLastError();
}

}  // namespace

size_t gemm_wgmma_workspace_bytes(int M, int N, int K) {
    return 2 * (static_cast<size_t>(M) + static_cast<size_t>(N)) * round_up4(K) * sizeof(float);
}

cudaError_t gemm_wgmma_built(bool* built) {
    int v = 0;
    const cudaError_t e = cudaMemcpyFromSymbol(&v, g_wgmma_built, sizeof(int));
    *built = e == cudaSuccess && v == 1;
    return e;
}

GemmWgmmaConfig gemm_wgmma_config(int passes) {
    const bool three = passes == 3;
    return {kBM, kBN, kBK, three ? Stage<3>::kCount : Stage<1>::kCount, kThreads,
            three ? Stage<3>::kSmem : Stage<1>::kSmem};
}

cudaError_t launch_gemm_wgmma(const float* a, const float* b, float* c, int M, int N, int K, int passes,
                              int version, void* workspace, cudaStream_t stream) {
    if (M <= 0 || N <= 0 || K <= 0 || (passes != 1 && passes != 3) || (version != 1 && version != 2) ||
        workspace == nullptr)
        return cudaErrorInvalidValue;
    const int Kp = round_up4(K);
    float* a_hi = static_cast<float*>(workspace);
    float* a_lo = a_hi + static_cast<size_t>(M) * Kp;
    float* b_hi = a_lo + static_cast<size_t>(M) * Kp;
    float* b_lo = b_hi + static_cast<size_t>(N) * Kp;
    cudaError_t e = split<false>(a, M, K, Kp, a_hi, a_lo, stream);
    if (e == cudaSuccess) e = split<true>(b, N, K, Kp, b_hi, b_lo, stream);
    if (e != cudaSuccess) return e;
    CUtensorMap maps[4];
    if (!plane_map(&maps[0], a_hi, M, Kp) || !plane_map(&maps[1], b_hi, N, Kp) ||
        !plane_map(&maps[2], a_lo, M, Kp) || !plane_map(&maps[3], b_lo, N, Kp))
        return cudaErrorInvalidValue;
    if (passes == 3) return version == 1 ? launch<3, 1>(maps, c, M, N, Kp, stream) : launch<3, 2>(maps, c, M, N, Kp, stream);
    return version == 1 ? launch<1, 1>(maps, c, M, N, Kp, stream) : launch<1, 2>(maps, c, M, N, Kp, stream);
}

cudaError_t launch_wgmma_ceiling(const unsigned* seeds, float* out, long long* clocks, int blocks, int iters,
                                 cudaStream_t stream) {
    if (blocks <= 0 || iters < 0) return cudaErrorInvalidValue;
    cudaError_t e = cudaFuncSetAttribute(wgmma_ceiling_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         kCeilingSmem);
    if (e != cudaSuccess) return e;
    wgmma_ceiling_kernel<<<blocks, kWgmmaCeilingThreads, kCeilingSmem, stream>>>(seeds, out, clocks, iters);
    return cudaGetLastError();
}
