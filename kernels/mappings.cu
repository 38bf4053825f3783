// mappings.cu — one operation, eleven thread mappings: y[n,c,h,w] = x[n,c,h,w]·a[c] + b[c] (NCHW, fp32).
//
// Chapter 4 (coalescing). The operation is the per-channel affine map that ends P73 once BatchNorm and
// the scale are folded (eval mode), on the P73 conv output's shape (128, 64, 126, 126). It was chosen
// because its memory pattern is the whole story: every element is loaded once and stored once, and
// nothing else touches global memory. The coefficients a[c], b[c] travel by value in the kernel's
// parameter block (they are read from the constant bank, not with global loads), so the profiler's
// global load and store counters see x and y only — exactly what the chapter's model predicts.
//
// Every kernel computes the same value with one fmaf (one rounding); they differ only in which thread
// handles which element, i.e. in the addresses a warp's 32 lanes present to the memory system at once.
// Threads that fall outside the tensor return at once: a warp whose lanes all returned issues nothing.
// Mappings 7-11 are controls for the chapter's causal claims: the scattered mapping with its coefficients
// in shared memory; flat, float4 and per-plane mappings with four independent accesses per thread; and the
// float4 mapping with its index arithmetic in 32 bits instead of 64.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "mappings.h"

namespace {

constexpr int kMaxChannels = 256;  // P73 has 64; the parameter block holds 2 × 256 floats = 2 KiB (limit 4 KiB)
constexpr int kFlatThreads = 256;  // 1-D blocks of 8 warps for the flat mappings
constexpr int kUnroll = 4;         // independent loads per thread in the unrolled mappings (8-10)
constexpr int kPlaneChunk = kFlatThreads * kUnroll * 4;  // floats per block of planes_vec4_x4: 4,096

struct Coeffs {
    float a[kMaxChannels];
    float b[kMaxChannels];
};

struct Shape {
    int64_t n, c, h, w;
    __host__ __device__ int64_t hw() const { return h * w; }
    __host__ __device__ int64_t numel() const { return n * c * h * w; }
};

// excerpt: flat
// 1. One thread per output, flat NCHW index: consecutive lanes, consecutive w.
__global__ void __launch_bounds__(kFlatThreads)
flat_kernel(const float* __restrict__ x, float* __restrict__ y, const Coeffs p,
            const Shape s) {
    const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
    if (i >= s.numel()) return;
    const int c = static_cast<int>((i / s.hw()) % s.c);
    y[i] = fmaf(x[i], p.a[c], p.b[c]);
}
// end excerpt: flat

// The affine map of four consecutive elements starting at flat index i (they may span two channels).
__device__ __forceinline__ float4 affine4(float4 v, int64_t i, const Coeffs& p, const Shape& s) {
    const int c0 = static_cast<int>((i / s.hw()) % s.c), c1 = static_cast<int>(((i + 1) / s.hw()) % s.c);
    const int c2 = static_cast<int>(((i + 2) / s.hw()) % s.c), c3 = static_cast<int>(((i + 3) / s.hw()) % s.c);
    return make_float4(fmaf(v.x, p.a[c0], p.b[c0]), fmaf(v.y, p.a[c1], p.b[c1]), fmaf(v.z, p.a[c2], p.b[c2]),
                       fmaf(v.w, p.a[c3], p.b[c3]));
}

// 2. Four consecutive outputs per thread as one 16-byte float4 access (needs numel % 4 == 0 and
//    16-byte aligned x and y: the binding checks). The four may belong to two channels when H·W % 4 != 0.
__global__ void __launch_bounds__(kFlatThreads)
flat_vec4_kernel(const float* __restrict__ x, float* __restrict__ y, const Coeffs p, const Shape s) {
    const int64_t i4 = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i4 >= s.numel() / 4) return;
    const float4 v = reinterpret_cast<const float4*>(x)[i4];
    reinterpret_cast<float4*>(y)[i4] = affine4(v, 4 * i4, p, s);
}

// excerpt: channel_fastest
// 3. One thread per output, channel fastest across lanes: lane k of a warp
//    holds channel k of a pixel, H·W floats away from its neighbour (what an
//    NHWC-minded index computation does to an NCHW tensor).
__global__ void __launch_bounds__(kFlatThreads)
channel_fastest_kernel(const float* __restrict__ x, float* __restrict__ y,
                       const Coeffs p, const Shape s) {
    const int64_t t = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
    if (t >= s.numel()) return;
    const int c = static_cast<int>(t % s.c);
    const int64_t q = t / s.c;  // pixel: (n, h·w)
    const int64_t i = ((q / s.hw()) * s.c + c) * s.hw() + q % s.hw();
    y[i] = fmaf(x[i], p.a[c], p.b[c]);  // 32 lanes: 32 planes, 32 coefficients
}
// end excerpt: channel_fastest

// 4. One thread per pixel (n, h, w), looping over the channels: each load and store instruction is
//    contiguous across lanes, although one thread's successive accesses are H·W floats apart.
__global__ void __launch_bounds__(kFlatThreads)
pixel_loop_kernel(const float* __restrict__ x, float* __restrict__ y, const Coeffs p, const Shape s) {
    const int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (q >= s.n * s.hw()) return;
    const int64_t hw = s.hw();
    int64_t i = (q / hw) * s.c * hw + q % hw;
    for (int c = 0; c < s.c; ++c, i += hw) y[i] = fmaf(x[i], p.a[c], p.b[c]);
}

// 5.–7. 3-D blocks: threadIdx.x along w, threadIdx.y along h, threadIdx.z along channels; blockIdx.x/.y
// tile w and h, blockIdx.z runs over (n, channel tile). Warps are formed from threadIdx linearised
// x-fastest, so a warp holds 32 / TW rows of TW floats — or, when TW·TH is not a multiple of 32, lanes of
// two channels.
// excerpt: tile
template <int TW, int TH, int TC>
__global__ void __launch_bounds__(TW * TH * TC)
tile_kernel(const float* __restrict__ x, float* __restrict__ y, const Coeffs p,
            const Shape s) {
    const int64_t c_tiles = (s.c + TC - 1) / TC;
    const int64_t w = static_cast<int64_t>(blockIdx.x) * TW + threadIdx.x;
    const int64_t h = static_cast<int64_t>(blockIdx.y) * TH + threadIdx.y;
    const int64_t n = blockIdx.z / c_tiles;
    const int c = static_cast<int>((blockIdx.z % c_tiles) * TC + threadIdx.z);
    if (w >= s.w || h >= s.h || c >= s.c) return;
    const int64_t i = ((n * s.c + c) * s.h + h) * s.w + w;
    y[i] = fmaf(x[i], p.a[c], p.b[c]);
}
// end excerpt: tile

// 7'. Whole rows: a block of W × 4 threads covers 4 rows of one plane; 504 threads for W = 126, so warps
//     straddle rows (and the last warp of a block has 24 lanes). blockIdx.x runs over (n, c, row group).
__global__ void __launch_bounds__(1024)
rows_kernel(const float* __restrict__ x, float* __restrict__ y, const Coeffs p, const Shape s) {
    constexpr int kRows = 4;
    const int64_t row_groups = (s.h + kRows - 1) / kRows;
    const int64_t plane = blockIdx.x / row_groups;  // n·C + c
    const int64_t h = (blockIdx.x % row_groups) * kRows + threadIdx.y;
    if (h >= s.h) return;
    const int c = static_cast<int>(plane % s.c);
    const int64_t i = (plane * s.h + h) * s.w + threadIdx.x;
    y[i] = fmaf(x[i], p.a[c], p.b[c]);
}

// 8. channel_fastest with its coefficients in shared memory: the same thread → element mapping (and so the
//    same global requests and sectors), but the per-lane coefficient reads no longer go to the constant
//    bank with 32 different addresses per warp (which the constant cache serves one address at a time).
__global__ void __launch_bounds__(kFlatThreads)
channel_fastest_smem_kernel(const float* __restrict__ x, float* __restrict__ y, const Coeffs p, const Shape s) {
    // excerpt: coefficients_in_smem
    __shared__ float sa[kMaxChannels], sb[kMaxChannels];
    const int warp = static_cast<int>(threadIdx.x) / 32;
    const int lane = static_cast<int>(threadIdx.x) % 32;
    for (int k = warp; k < s.c; k += kFlatThreads / 32) {  // k is warp-uniform
        const float ak = p.a[k], bk = p.b[k];
        if (lane == 0) {
            sa[k] = ak;
            sb[k] = bk;
        }
    }
    __syncthreads();  // before any thread returns
    // end excerpt: coefficients_in_smem
    const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= s.numel()) return;
    const int c = static_cast<int>(t % s.c);
    const int64_t q = t / s.c;
    const int64_t i = ((q / s.hw()) * s.c + c) * s.hw() + q % s.hw();
    y[i] = fmaf(x[i], sa[c], sb[c]);  // 32 consecutive words of shared memory: no bank conflict
}

// 9. flat, unrolled: a block covers kFlatThreads·kUnroll consecutive floats and thread t handles
//    t, t + 256, t + 512, t + 768 of them. Each of the four loads is a contiguous warp-wide access like
//    flat's; all four are issued before the first store, so a thread has 16 bytes in flight, not 4.
__global__ void __launch_bounds__(kFlatThreads)
flat_x4_kernel(const float* __restrict__ x, float* __restrict__ y, const Coeffs p, const Shape s) {
    // excerpt: flat_x4
    const int64_t tile = int64_t{blockIdx.x} * (kFlatThreads * kUnroll);
    const int64_t base = tile + threadIdx.x;
    const int64_t n = s.numel();
    float v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {  // kUnroll independent loads
        const int64_t i = base + u * kFlatThreads;
        v[u] = i < n ? x[i] : 0.f;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
        const int64_t i = base + u * kFlatThreads;
        if (i < n) {
            const int c = static_cast<int>((i / s.hw()) % s.c);
            y[i] = fmaf(v[u], p.a[c], p.b[c]);
        }
    }
    // end excerpt: flat_x4
}

// 10. flat_vec4, unrolled: kUnroll float4 per thread, loaded before the first store (64 bytes in flight).
__global__ void __launch_bounds__(kFlatThreads)
flat_vec4_x4_kernel(const float* __restrict__ x, float* __restrict__ y, const Coeffs p, const Shape s) {
    const int64_t base = static_cast<int64_t>(blockIdx.x) * (kFlatThreads * kUnroll) + threadIdx.x;
    const int64_t n4 = s.numel() / 4;
    float4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
        const int64_t j = base + u * kFlatThreads;
        v[u] = j < n4 ? reinterpret_cast<const float4*>(x)[j] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
        const int64_t j = base + u * kFlatThreads;
        if (j < n4) reinterpret_cast<float4*>(y)[j] = affine4(v[u], 4 * j, p, s);
    }
}

// 11. One (n, c) plane per blockIdx.x, kPlaneChunk floats of it per blockIdx.y: the channel is the same
//     for the whole block, so its coefficients are two broadcast loads and there is no division per element.
//     With H·W % 4 == 0 and 16-byte aligned x and y (vec), every plane starts on a 16-byte boundary and each
//     thread moves kUnroll float4; otherwise the same tile as 4·kUnroll scalar floats per thread.
__global__ void __launch_bounds__(kFlatThreads)
planes_vec4_x4_kernel(const float* __restrict__ x, float* __restrict__ y, const Coeffs p, const Shape s,
                      bool vec) {
    // excerpt: planes
    const int64_t plane = blockIdx.x;  // n·C + c
    const int c = static_cast<int>(plane % s.c);
    const float a = p.a[c], b = p.b[c];  // one address for the whole block
    const int64_t hw = s.hw();
    const float* xp = x + plane * hw;
    float* yp = y + plane * hw;
    if (vec) {
        const float4* x4 = reinterpret_cast<const float4*>(xp);
        float4* y4 = reinterpret_cast<float4*>(yp);
        const int64_t n4 = hw / 4;
        const int64_t tile = int64_t{blockIdx.y} * (kFlatThreads * kUnroll);
        const int64_t base = tile + threadIdx.x;
        float4 v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {  // independent 16-byte loads
            const int64_t j = base + u * kFlatThreads;
            v[u] = j < n4 ? x4[j] : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int64_t j = base + u * kFlatThreads;
            if (j < n4) {
                const float4 w = v[u];
                y4[j] = make_float4(fmaf(w.x, a, b), fmaf(w.y, a, b),
                                    fmaf(w.z, a, b), fmaf(w.w, a, b));
            }
        }
        return;
    }
    // end excerpt: planes
    const int64_t base = static_cast<int64_t>(blockIdx.y) * kPlaneChunk + threadIdx.x;
    float v[4 * kUnroll];
#pragma unroll
    for (int u = 0; u < 4 * kUnroll; ++u) {
        const int64_t i = base + u * kFlatThreads;
        v[u] = i < hw ? xp[i] : 0.f;
    }
#pragma unroll
    for (int u = 0; u < 4 * kUnroll; ++u) {
        const int64_t i = base + u * kFlatThreads;
        if (i < hw) yp[i] = fmaf(v[u], a, b);
    }
}

// 12. flat_vec4_x4 with 32-bit index arithmetic (a control; needs numel < 2^31, the binding checks): the same
//     loads, stores and coefficient reads, but each element's channel (i / HW) % C costs a 32-bit division and
//     modulo — a short inline sequence — where int64_t needs a call to a much longer 64-bit routine.
__device__ __forceinline__ float4 affine4_u32(float4 v, uint32_t i, const Coeffs& p, uint32_t hw, uint32_t c) {
    const uint32_t c0 = (i / hw) % c, c1 = ((i + 1) / hw) % c, c2 = ((i + 2) / hw) % c, c3 = ((i + 3) / hw) % c;
    return make_float4(fmaf(v.x, p.a[c0], p.b[c0]), fmaf(v.y, p.a[c1], p.b[c1]), fmaf(v.z, p.a[c2], p.b[c2]),
                       fmaf(v.w, p.a[c3], p.b[c3]));
}

__global__ void __launch_bounds__(kFlatThreads)
flat_vec4_x4_i32_kernel(const float* __restrict__ x, float* __restrict__ y, const Coeffs p, const Shape s) {
    const uint32_t base = blockIdx.x * (kFlatThreads * kUnroll) + threadIdx.x;
    const uint32_t n4 = static_cast<uint32_t>(s.numel() / 4);
    const uint32_t hw = static_cast<uint32_t>(s.hw()), c = static_cast<uint32_t>(s.c);
    float4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
        const uint32_t j = base + u * kFlatThreads;
        v[u] = j < n4 ? reinterpret_cast<const float4*>(x)[j] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
        const uint32_t j = base + u * kFlatThreads;
        if (j < n4) reinterpret_cast<float4*>(y)[j] = affine4_u32(v[u], 4 * j, p, hw, c);
    }
}

template <int TW, int TH, int TC>
cudaError_t launch_tile(const float* x, float* y, const Coeffs& p, const Shape& s, cudaStream_t stream) {
    const int64_t gx = (s.w + TW - 1) / TW, gy = (s.h + TH - 1) / TH, gz = s.n * ((s.c + TC - 1) / TC);
    if (gx > INT_MAX || gy > 65535 || gz > 65535) return cudaErrorInvalidConfiguration;
    tile_kernel<TW, TH, TC><<<dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy), static_cast<unsigned>(gz)),
                              dim3(TW, TH, TC), 0, stream>>>(x, y, p, s);
    return cudaGetLastError();
}

cudaError_t launch_flat(void (*k)(const float*, float*, const Coeffs, const Shape), int64_t threads,
                        const float* x, float* y, const Coeffs& p, const Shape& s, cudaStream_t stream) {
    const int64_t blocks = (threads + kFlatThreads - 1) / kFlatThreads;  // ceil, never floor
    if (blocks > INT_MAX) return cudaErrorInvalidConfiguration;
    k<<<static_cast<unsigned>(blocks), kFlatThreads, 0, stream>>>(x, y, p, s);
    return cudaGetLastError();
}

}  // namespace

int mappings_max_channels() { return kMaxChannels; }
int mappings_flat_threads() { return kFlatThreads; }
int mappings_unroll() { return kUnroll; }

// The mappings by number, in the order of the chapter's table (the binding maps names to numbers):
// 0 flat, 1 flat_vec4, 2 channel_fastest, 3 pixel_loop, 4 tile_7x18x4, 5 tile_8x8x8, 6 rows_w_x4,
// 7 channel_fastest_smem, 8 flat_x4, 9 flat_vec4_x4, 10 planes_vec4_x4, 11 flat_vec4_x4_i32.
// a and b are host arrays of c floats (c <= kMaxChannels). Returns the launch's error; nothing is
// launched for an empty tensor.
cudaError_t launch_affine(int mapping, const float* x, float* y, const float* a, const float* b, int64_t n,
                          int64_t c, int64_t h, int64_t w, cudaStream_t stream) {
    if (c < 1 || c > kMaxChannels) return cudaErrorInvalidValue;
    const Shape s{n, c, h, w};
    if (s.numel() == 0) return cudaSuccess;
    Coeffs p{};
    for (int64_t k = 0; k < c; ++k) {
        p.a[k] = a[k];
        p.b[k] = b[k];
    }
    switch (mapping) {
        case 0: return launch_flat(flat_kernel, s.numel(), x, y, p, s, stream);
        case 1:
            if (s.numel() % 4 != 0) return cudaErrorInvalidValue;
            return launch_flat(flat_vec4_kernel, s.numel() / 4, x, y, p, s, stream);
        case 2: return launch_flat(channel_fastest_kernel, s.numel(), x, y, p, s, stream);
        case 3: return launch_flat(pixel_loop_kernel, s.n * s.hw(), x, y, p, s, stream);
        case 4: return launch_tile<18, 7, 4>(x, y, p, s, stream);  // 18·7 = 126 threads per channel slice
        case 5: return launch_tile<8, 8, 8>(x, y, p, s, stream);
        case 6: {
            if (w > 256) return cudaErrorInvalidConfiguration;  // W × 4 threads ≤ 1024
            const int64_t blocks = n * c * ((h + 3) / 4);
            if (blocks > INT_MAX) return cudaErrorInvalidConfiguration;
            rows_kernel<<<static_cast<unsigned>(blocks), dim3(static_cast<unsigned>(w), 4), 0, stream>>>(x, y, p, s);
            return cudaGetLastError();
        }
        case 7: return launch_flat(channel_fastest_smem_kernel, s.numel(), x, y, p, s, stream);
        case 8: return launch_flat(flat_x4_kernel, (s.numel() + kUnroll - 1) / kUnroll, x, y, p, s, stream);
        case 9: {
            if (s.numel() % 4 != 0) return cudaErrorInvalidValue;
            return launch_flat(flat_vec4_x4_kernel, (s.numel() / 4 + kUnroll - 1) / kUnroll, x, y, p, s, stream);
        }
        case 10: {
            const int64_t planes = n * c, chunks = (s.hw() + kPlaneChunk - 1) / kPlaneChunk;
            if (planes > INT_MAX || chunks > 65535) return cudaErrorInvalidConfiguration;
            const uintptr_t addr_bits = reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(y);
            const bool vec = s.hw() % 4 == 0 && (addr_bits & 15u) == 0;  // every plane 16-byte aligned
            planes_vec4_x4_kernel<<<dim3(static_cast<unsigned>(planes), static_cast<unsigned>(chunks)), kFlatThreads, 0,
                                    stream>>>(x, y, p, s, vec);
            return cudaGetLastError();
        }
        case 11: {
            if (s.numel() % 4 != 0 || s.numel() >= (int64_t{1} << 31)) return cudaErrorInvalidValue;
            return launch_flat(flat_vec4_x4_i32_kernel, (s.numel() / 4 + kUnroll - 1) / kUnroll, x, y, p, s, stream);
        }
        default: return cudaErrorInvalidValue;
    }
}
