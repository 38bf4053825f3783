// scale.cu — y = s·x over a float32 array of any length.
//
// The method chapter's kernel: small enough to read in a minute, fast enough to sit on the
// copy ceiling. Plain CUDA: no torch headers, so `nvcc -c scale.cu` compiles it anywhere.
//
// Two paths:
//   * vector path — both pointers 16-byte aligned: each thread moves float4s (one 16-byte load
//     and one 16-byte store per 4 elements), kUnroll of them in flight per loop trip; the last
//     n % 4 elements (the "tail") are done with scalar accesses by the first threads of block 0.
//   * scalar path — either pointer misaligned (a view such as x[1:] starts 4 bytes past a
//     16-byte boundary): a float4 access there would fault, so every element is moved singly.
#include <cuda_runtime.h>

#include <cstdint>

namespace {

constexpr int kThreads = 256;       // 8 warps per block
constexpr int kUnroll = 4;          // independent float4 loads per thread before the first store
constexpr int kBlocksPerSM = 8;     // 8 × 256 = 2048 threads: a full Hopper/Ampere SM

__global__ void __launch_bounds__(kThreads)
scale_vec4_kernel(const float* __restrict__ x, float* __restrict__ y, float s, int64_t n) {
    const int64_t n4 = n / 4;  // whole float4s
    const float4* __restrict__ x4 = reinterpret_cast<const float4*>(x);
    float4* __restrict__ y4 = reinterpret_cast<float4*>(y);
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;

    // Main loop: kUnroll loads issued back to back, so each thread has 64 bytes in flight.
    for (; i + (kUnroll - 1) * stride < n4; i += kUnroll * stride) {
        float4 v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) v[u] = x4[i + u * stride];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            v[u].x *= s; v[u].y *= s; v[u].z *= s; v[u].w *= s;
            y4[i + u * stride] = v[u];
        }
    }
    // Remainder of whole float4s (fewer than kUnroll per thread).
    for (; i < n4; i += stride) {
        float4 v = x4[i];
        v.x *= s; v.y *= s; v.z *= s; v.w *= s;
        y4[i] = v;
    }
    // Scalar tail: the last n % 4 elements.
    if (blockIdx.x == 0 && threadIdx.x < n - 4 * n4) {
        const int64_t j = 4 * n4 + threadIdx.x;
        y[j] = s * x[j];
    }
}

__global__ void __launch_bounds__(kThreads)
scale_scalar_kernel(const float* __restrict__ x, float* __restrict__ y, float s, int64_t n) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        y[i] = s * x[i];
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

// Launches y[i] = s * x[i] for i < n on `stream`. x and y must not overlap.
// Returns the launch's error (cudaSuccess when nothing was launched because n == 0).
cudaError_t launch_scale(const float* x, float* y, float s, int64_t n, cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    int device = 0, sms = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) return err;
    err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (err != cudaSuccess) return err;

    const bool vec = aligned16(x) && aligned16(y);
    // Work items per thread-slot: float4s on the vector path, floats on the scalar path.
    const int64_t items = vec ? (n + 3) / 4 : n;
    const int64_t wanted = (items + kThreads - 1) / kThreads;                // ceil, never floor
    const int64_t cap = static_cast<int64_t>(sms) * kBlocksPerSM;            // one full wave
    const unsigned blocks = static_cast<unsigned>(wanted < cap ? wanted : cap);
    if (vec)
        scale_vec4_kernel<<<blocks, kThreads, 0, stream>>>(x, y, s, n);
    else
        scale_scalar_kernel<<<blocks, kThreads, 0, stream>>>(x, y, s, n);
    return cudaGetLastError();
}
