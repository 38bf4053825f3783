// ceilings.cu — two kernels that measure the GPU's ceilings: how many bytes per second it can stream
// from DRAM and back, and how many FP32 fused multiply-adds per second it can retire.
//
// A roofline needs both numbers, measured, not read off a datasheet: the datasheet's bandwidth is the
// pins' signalling rate and its FLOP/s assumes the boost clock. Plain CUDA: no torch headers.
//
// copy  — y = x over float32 arrays, in 16-byte float4 accesses (x and y must be 16-byte aligned;
//         the last n % 4 elements, the "tail", are copied by block 0 with scalar accesses). Work comes in
//         tiles of 256 threads × U float4 (U = 1, 4 or 8: 4, 16 or 32 KiB); a thread issues its U loads
//         before its first store, and block b copies tiles b, b + grid, b + 2·grid, … Two grids:
//         *tiles* — one block per tile, so the GPU's block scheduler hands each next tile to whichever SM
//         has room (a dynamic schedule done by the hardware: no counter, nothing to reset, nothing shared
//         between launches); *resident* — exactly as many blocks as fit on the GPU at once (SM count ×
//         blocks per SM), each with a fixed share. Optional streaming cache hints (kStreaming:
//         ld.global.cs / st.global.cs, "evict first"). Chapter 3 measures all of them.
// ffma  — kChains independent recurrences a ← fma(a, m, c_j) per thread, kUnroll steps per loop trip:
//         with as many 256-thread blocks as fit (few registers: the SM's full 2048 threads on an H200,
//         i.e. 16 warps per SM sub-partition), each warp holding 8 independent FMAs, the FP32 pipes
//         never wait on a result. Each thread writes the sum of its chains, so nothing can be deleted, and
//         thread 0 of each block records the SM cycles and nanoseconds its loop took: their ratio is
//         the clock the kernel actually ran at.
#include "ceilings.h"

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

namespace {

constexpr int kCopyThreads = 256;  // 8 warps per block

template <bool kStreaming>
__device__ __forceinline__ float4 load4(const float4* p) {
    if constexpr (kStreaming) return __ldcs(p);
    else return *p;
}
template <bool kStreaming>
__device__ __forceinline__ void store4(float4* p, const float4& v) {
    if constexpr (kStreaming) __stcs(p, v);
    else *p = v;
}

template <int kCopyUnroll, bool kStreaming>  // kCopyUnroll: float4 loads in flight per thread
__global__ void __launch_bounds__(kCopyThreads)
copy_vec4_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n, int64_t tiles) {
    constexpr int64_t kCopyTile = int64_t{kCopyThreads} * kCopyUnroll;  // float4s per tile
    const int64_t n4 = n / 4;
    const float4* __restrict__ x4 = reinterpret_cast<const float4*>(x);
    float4* __restrict__ y4 = reinterpret_cast<float4*>(y);

    // excerpt: copy-tile
    // Grid-stride over tiles: one trip per block on the "tiles" grid.
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const int64_t base = tile * kCopyTile + threadIdx.x;
        // A whole tile: no bounds checks.
        if (base + (kCopyUnroll - 1) * kCopyThreads < n4) {
            float4 v[kCopyUnroll];
#pragma unroll
            for (int u = 0; u < kCopyUnroll; ++u)
                v[u] = load4<kStreaming>(x4 + base + u * kCopyThreads);
#pragma unroll
            for (int u = 0; u < kCopyUnroll; ++u)
                store4<kStreaming>(y4 + base + u * kCopyThreads, v[u]);
        } else {  // the last, partial tile
#pragma unroll
            for (int u = 0; u < kCopyUnroll; ++u) {
                const int64_t i = base + u * kCopyThreads;
                if (i < n4) store4<kStreaming>(y4 + i, load4<kStreaming>(x4 + i));
            }
        }
    }
    // end excerpt: copy-tile
    if (blockIdx.x == 0 && threadIdx.x < n - 4 * n4) {  // the tail: the last n % 4 elements
        const int64_t j = 4 * n4 + threadIdx.x;
        y[j] = x[j];
    }
}

constexpr int kFfmaThreads = 256;  // 8 warps per block
constexpr int kChains = 8;         // independent FMA chains per thread
constexpr int kFfmaUnroll = 32;    // steps per loop trip: 256 FFMAs against ~3 loop instructions

__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__global__ void __launch_bounds__(kFfmaThreads)
ffma_kernel(float* __restrict__ out, long long* __restrict__ clocks, int iters, float m, float c) {
    const int64_t t = static_cast<int64_t>(blockIdx.x) * kFfmaThreads + threadIdx.x;
    float a[kChains], cj[kChains];
#pragma unroll
    for (int j = 0; j < kChains; ++j) {
        a[j] = static_cast<float>((t & 63) + j);  // a_j(0) = (t mod 64) + j: distinct chains
        cj[j] = c * static_cast<float>(j + 1);    // c_j = c·(j + 1)
    }
    // excerpt: ffma-loop
    const long long cycles0 = clock64();
    const unsigned long long ns0 = global_ns();
    int i = 0;
    for (; i + kFfmaUnroll <= iters; i += kFfmaUnroll) {
#pragma unroll
        for (int u = 0; u < kFfmaUnroll; ++u) {
#pragma unroll
            for (int j = 0; j < kChains; ++j) a[j] = fmaf(a[j], m, cj[j]);
        }
    }
#pragma unroll 1
    for (; i < iters; ++i) {  // iters % kFfmaUnroll leftover steps
#pragma unroll
        for (int j = 0; j < kChains; ++j) a[j] = fmaf(a[j], m, cj[j]);
    }
    const long long cycles1 = clock64();
    const unsigned long long ns1 = global_ns();
    // end excerpt: ffma-loop
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < kChains; ++j) s += a[j];
    out[t] = s;
    if (clocks != nullptr && threadIdx.x == 0) {
        clocks[2 * blockIdx.x] = cycles1 - cycles0;
        clocks[2 * blockIdx.x + 1] = static_cast<long long>(ns1 - ns0);
    }
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

inline cudaError_t resident_grid(const void* kernel, int threads, int* blocks) {
    int dev = 0, sms = 0, per_sm = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (err == cudaSuccess) err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0);
    *blocks = sms * per_sm;
    return err;
}

template <int kCopyUnroll, bool kStreaming>
const void* copy_kernel() {
    return reinterpret_cast<const void*>(copy_vec4_kernel<kCopyUnroll, kStreaming>);
}

template <int kCopyUnroll, bool kStreaming>
cudaError_t launch_copy_t(const float* x, float* y, int64_t n, bool resident_only, cudaStream_t stream) {
    constexpr int64_t kCopyTile = int64_t{kCopyThreads} * kCopyUnroll;
    const int64_t tiles = (n / 4 + kCopyTile - 1) / kCopyTile;  // ceil, never floor
    int64_t blocks = tiles < INT_MAX ? tiles : INT_MAX;  // past 2^31 - 1 tiles, blocks loop (grid-stride)
    if (resident_only) {
        int resident = 0;
        const cudaError_t err = resident_grid(copy_kernel<kCopyUnroll, kStreaming>(), kCopyThreads, &resident);
        if (err != cudaSuccess) return err;
        if (blocks > resident) blocks = resident;
    }
    if (blocks < 1) blocks = 1;  // n < 4: block 0 does the tail
    copy_vec4_kernel<kCopyUnroll, kStreaming><<<static_cast<unsigned>(blocks), kCopyThreads, 0, stream>>>(x, y, n, tiles);
    return cudaGetLastError();
}

template <int kCopyUnroll>
cudaError_t launch_copy_u(const float* x, float* y, int64_t n, bool resident_only, bool streaming,
                          cudaStream_t stream) {
    if (streaming) return launch_copy_t<kCopyUnroll, true>(x, y, n, resident_only, stream);
    return launch_copy_t<kCopyUnroll, false>(x, y, n, resident_only, stream);
}

}  // namespace

// Threads per block of the FFMA kernel and chains per thread: FLOP = 2 · blocks · threads · chains · iters.
int ffma_threads_per_block() { return kFfmaThreads; }
int ffma_chains() { return kChains; }

// Blocks of the FFMA kernel (ffma = true) or of the 1-float4 copy that are resident on the whole GPU at
// once: SMs × blocks per SM.
cudaError_t ceilings_resident_blocks(bool ffma, int* blocks) {
    return ffma ? resident_grid(reinterpret_cast<const void*>(ffma_kernel), kFfmaThreads, blocks)
                : resident_grid(copy_kernel<1, false>(), kCopyThreads, blocks);
}

// y[i] = x[i] for i < n. x and y: 16-byte aligned, not overlapping. unroll: 1, 4 or 8 float4 per thread
// per tile. resident_only: grid = the blocks resident at once (else one block per tile). streaming:
// evict-first cache hints. Returns the launch's error.
cudaError_t launch_copy(const float* x, float* y, int64_t n, int unroll, bool resident_only, bool streaming,
                        cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    if (!aligned16(x) || !aligned16(y)) return cudaErrorInvalidValue;
    if (unroll == 1) return launch_copy_u<1>(x, y, n, resident_only, streaming, stream);
    if (unroll == 4) return launch_copy_u<4>(x, y, n, resident_only, streaming, stream);
    if (unroll == 8) return launch_copy_u<8>(x, y, n, resident_only, streaming, stream);
    return cudaErrorInvalidValue;
}

// out[t] = Σ_j a_j after `iters` steps a_j ← fma(a_j, m, c·(j+1)) from a_j = (t mod 64) + j, for
// t < blocks · ffma_threads_per_block(). clocks (may be null): 2 per block, SM cycles and ns of the loop.
cudaError_t launch_ffma(float* out, long long* clocks, int blocks, int iters, float m, float c,
                        cudaStream_t stream) {
    if (blocks <= 0 || iters < 0) return cudaErrorInvalidValue;
    ffma_kernel<<<static_cast<unsigned>(blocks), kFfmaThreads, 0, stream>>>(out, clocks, iters, m, c);
    return cudaGetLastError();
}
