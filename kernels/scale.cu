// scale.cu — y = s·x over a float32 array of any length.
//
// The method chapter's kernel: small enough to read in a minute. It runs a few per cent below the
// rate of a device-to-device copy measured in the same run (a reference rate, not a ceiling), and
// PyTorch's own `x * s` is a little faster still at large sizes; notes/scale.md logs the versions.
// Plain CUDA: no torch headers, so `nvcc -c scale.cu` compiles it anywhere.
//
// Each block owns one contiguous tile of kThreads × kUnroll work items and each thread issues its
// kUnroll loads before its first store; across a warp every load and store instruction covers
// consecutive addresses. Two paths:
//   * vector path — both pointers 16-byte aligned: work items are float4s (16-byte loads and
//     stores); the last n % 4 elements (the "tail") are done with scalar accesses by block 0.
//   * scalar path — either pointer misaligned (a view such as x[1:] starts 4 bytes past a
//     16-byte boundary): a float4 access there would fault, so work items are single floats.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "scale.h"

namespace {

constexpr int kThreads = 256;                           // 8 warps per block
constexpr int kUnroll = 4;                              // independent loads per thread before a store
constexpr int64_t kTile = int64_t{kThreads} * kUnroll;  // work items per block

__global__ void __launch_bounds__(kThreads)
scale_vec4_kernel(const float* __restrict__ x, float* __restrict__ y, float s, int64_t n) {
    const int64_t n4 = n / 4;  // whole float4s
    const float4* __restrict__ x4 = reinterpret_cast<const float4*>(x);
    float4* __restrict__ y4 = reinterpret_cast<float4*>(y);
    // excerpt: vector-loop
    // Block b owns float4s [b·kTile, (b+1)·kTile); thread t of it takes float4s
    // t, t + kThreads, t + 2·kThreads, … of the tile.
    const int64_t base = static_cast<int64_t>(blockIdx.x) * kTile + threadIdx.x;

    if (base + (kUnroll - 1) * kThreads < n4) {  // a whole tile: no bounds checks
        float4 v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) v[u] = x4[base + u * kThreads];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            v[u].x *= s; v[u].y *= s; v[u].z *= s; v[u].w *= s;
            y4[base + u * kThreads] = v[u];
        }
    } else {  // the last, partial tile
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int64_t i = base + u * kThreads;
            if (i < n4) {
                float4 v = x4[i];
                v.x *= s; v.y *= s; v.z *= s; v.w *= s;
                y4[i] = v;
            }
        }
    }
    // Scalar tail: the last n % 4 elements.
    if (blockIdx.x == 0 && threadIdx.x < n - 4 * n4) {
        const int64_t j = 4 * n4 + threadIdx.x;
        y[j] = s * x[j];
    }
    // end excerpt: vector-loop
}

__global__ void __launch_bounds__(kThreads)
scale_scalar_kernel(const float* __restrict__ x, float* __restrict__ y, float s, int64_t n) {
    const int64_t base = static_cast<int64_t>(blockIdx.x) * kTile + threadIdx.x;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
        const int64_t i = base + u * kThreads;
        if (i < n) y[i] = s * x[i];
    }
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

// Launches y[i] = s * x[i] for i < n on `stream`. x and y must not overlap.
// Returns the launch's error (cudaSuccess when nothing was launched because n == 0).
cudaError_t launch_scale(const float* x, float* y, float s, int64_t n, cudaStream_t stream) {
    // excerpt: alignment-fallback
    if (n <= 0) return cudaSuccess;
    const bool vec = aligned16(x) && aligned16(y);
    const int64_t items = vec ? n / 4 : n;         // float4s or floats
    int64_t blocks = (items + kTile - 1) / kTile;  // ceil, never floor
    if (blocks == 0) blocks = 1;                   // n < 4: block 0 does the tail
    if (blocks > INT_MAX) return cudaErrorInvalidValue;  // gridDim.x: < 2^31
    const unsigned grid = static_cast<unsigned>(blocks);
    if (vec)
        scale_vec4_kernel<<<grid, kThreads, 0, stream>>>(x, y, s, n);
    else
        scale_scalar_kernel<<<grid, kThreads, 0, stream>>>(x, y, s, n);
    return cudaGetLastError();
    // end excerpt: alignment-fallback
}

// The tiling constants, for the chapter's diagram (read from the built module, never retyped).
void scale_config(int* threads, int* unroll, int* vec_bytes) {
    *threads = kThreads;
    *unroll = kUnroll;
    *vec_bytes = static_cast<int>(sizeof(float4));
}
