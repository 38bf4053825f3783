// welford.cuh — mean and variance by (count, mean, M2) states merged with Chan's formula.
//
// A state summarises a set of values: n of them, their mean, and M2 = Σ (x − mean)². Two states
// combine exactly (up to rounding) — Chan, Golub & LeVeque:
//     n = na + nb,  δ = mb − ma,  mean = ma + δ·nb/n,  M2 = M2a + M2b + δ²·na·nb/n
// so partial results from threads, warps and blocks can be merged in any tree, and no step ever
// subtracts two large, nearly equal sums (the failure of E[x²] − E[x]², chapter 5). Counts are kept
// as floating-point numbers: exact in float up to 2^24, which callers respect per state.
#pragma once

#include <cuda_runtime.h>

namespace kb {

template <typename T>
struct Welford {
    T n, mean, m2;
};

// excerpt: chan-merge
// Merge b into a. Either side may be empty (n == 0); no division by zero happens.
template <typename T>
__host__ __device__ __forceinline__ void welford_merge(Welford<T>& a, const Welford<T>& b) {
    if (b.n == T(0)) return;
    if (a.n == T(0)) { a = b; return; }
    const T n = a.n + b.n;
    const T delta = b.mean - a.mean;
    const T wb = b.n / n;
    a.mean += delta * wb;
    a.m2 += b.m2 + delta * delta * a.n * wb;
    a.n = n;
}
// end excerpt: chan-merge

// The state of k values held in registers, by two passes over them (exact mean first, then M2).
template <int K>
__device__ __forceinline__ Welford<float> welford_of(const float (&v)[K], int k = K) {
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < K; ++i) sum += (i < k) ? v[i] : 0.f;
    const float mean = k > 0 ? sum / static_cast<float>(k) : 0.f;
    float m2 = 0.f;
#pragma unroll
    for (int i = 0; i < K; ++i) {
        const float d = (i < k) ? v[i] - mean : 0.f;
        m2 = fmaf(d, d, m2);
    }
    return {static_cast<float>(k), mean, m2};
}

// Merge the states of all 32 lanes of a warp; lane 0 ends with the total. Every lane of the warp
// must call this (full-mask shuffles): lanes with nothing to contribute pass an empty state.
template <typename T>
__device__ __forceinline__ Welford<T> welford_warp_reduce(Welford<T> s) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        Welford<T> o;
        o.n = __shfl_down_sync(0xffffffffu, s.n, offset);
        o.mean = __shfl_down_sync(0xffffffffu, s.mean, offset);
        o.m2 = __shfl_down_sync(0xffffffffu, s.m2, offset);
        welford_merge(s, o);
    }
    return s;
}

// Merge the states of a whole block (blockDim.x a multiple of 32, at most 1024); thread 0 ends with
// the total. Every thread of the block must call it. `scratch` holds one state per warp.
template <typename T>
__device__ __forceinline__ Welford<T> welford_block_reduce(Welford<T> s, Welford<T>* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    s = welford_warp_reduce(s);
    if (lane == 0) scratch[warp] = s;
    __syncthreads();
    if (warp == 0) {
        s = lane < warps ? scratch[lane] : Welford<T>{T(0), T(0), T(0)};
        s = welford_warp_reduce(s);
    }
    __syncthreads();  // scratch may be reused after return
    return s;
}

}  // namespace kb
