// mma_probe.cu — two measurements of the tensor core itself, for the tensor-core chapter.
//
// mma_probe: one m16n8k8 TF32 product on chosen values, so that the output shows what the tensor core does to
// an operand's 13 low mantissa bits (used or dropped) and how it rounds its float32 sum (to nearest, or toward
// zero). mma_ceiling: the mma.sync TF32 rate with operands that change from product to product, with the SM
// clock the loop ran at.
#include <cstdint>

#include "mma_probe.h"
#include "tf32.cuh"

namespace {

// The m16n8k8 TF32 fragment layout (PTX ISA, "Matrix Fragments for mma.m16n8k8"): lane = 4·g + t.
// A: a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4); B: b0 (k=t, n=g), b1 (k=t+4, n=g);
// C, D: c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1).
__global__ void mma_probe_kernel(const float* __restrict__ A, const float* __restrict__ B,
                                 const float* __restrict__ C, float* __restrict__ D, int round) {
    const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    const float av[4] = {A[g * 8 + t], A[(g + 8) * 8 + t], A[g * 8 + t + 4], A[(g + 8) * 8 + t + 4]};
    const float bv[2] = {B[t * 8 + g], B[(t + 4) * 8 + g]};
    uint32_t a[4], b[2];
    for (int i = 0; i < 4; ++i) {
        a[i] = __float_as_uint(av[i]);
#if __CUDA_ARCH__ >= 800
        if (round) asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(a[i]) : "f"(av[i]));
#endif
    }
    for (int i = 0; i < 2; ++i) {
        b[i] = __float_as_uint(bv[i]);
#if __CUDA_ARCH__ >= 800
        if (round) asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(b[i]) : "f"(bv[i]));
#endif
    }
    float acc[4] = {C[g * 8 + 2 * t], C[g * 8 + 2 * t + 1], C[(g + 8) * 8 + 2 * t], C[(g + 8) * 8 + 2 * t + 1]};
    kb::mma(acc, a, b);
    D[g * 8 + 2 * t] = acc[0], D[g * 8 + 2 * t + 1] = acc[1];
    D[(g + 8) * 8 + 2 * t] = acc[2], D[(g + 8) * 8 + 2 * t + 1] = acc[3];
}

__global__ void __launch_bounds__(kMmaCeilingThreads)
mma_ceiling_kernel(const unsigned* __restrict__ seeds, float* __restrict__ out, long long* __restrict__ clocks,
                   int iters) {
    // Each chain has its own A and B fragments (random bits with the exponent forced into [1, 2), so no
    // product overflows): the tensor core sees different operands on every issue, as in a real GEMM.
    uint32_t a[kMmaCeilingChains][4], b[kMmaCeilingChains][2];
    const unsigned* s = seeds + 6 * threadIdx.x;
#pragma unroll
    for (int u = 0; u < kMmaCeilingChains; ++u) {
#pragma unroll
        for (int r = 0; r < 4; ++r) a[u][r] = ((s[r] * (2654435761u * (u + 1))) & 0x007fffffu) | 0x3f800000u;
#pragma unroll
        for (int r = 0; r < 2; ++r) b[u][r] = ((s[4 + r] * (2246822519u * (u + 1))) & 0x007fffffu) | 0x3f800000u;
    }
    float acc[kMmaCeilingChains][4] = {};
    unsigned long long ns0 = 0, ns1 = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns0));
    const long long cycles0 = clock64();
    for (int it = 0; it < iters; ++it)
#pragma unroll
        for (int u = 0; u < kMmaCeilingChains; ++u) kb::mma(acc[u], a[u], b[u]);
    const long long cycles1 = clock64();
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns1));
    float sum = 0.f;
#pragma unroll
    for (int u = 0; u < kMmaCeilingChains; ++u) sum += acc[u][0] + acc[u][1] + acc[u][2] + acc[u][3];
    out[static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x] = sum;
    if (clocks != nullptr && threadIdx.x == 0) {
        clocks[2 * blockIdx.x] = cycles1 - cycles0;
        clocks[2 * blockIdx.x + 1] = static_cast<long long>(ns1 - ns0);
    }
}

}  // namespace

cudaError_t launch_mma_probe(const float* a, const float* b, const float* c, float* d, int round,
                             cudaStream_t stream) {
    mma_probe_kernel<<<1, 32, 0, stream>>>(a, b, c, d, round);
    return cudaGetLastError();
}

cudaError_t launch_mma_ceiling(const unsigned* seeds, float* out, long long* clocks, int blocks, int iters,
                               cudaStream_t stream) {
    if (blocks <= 0 || iters < 0) return cudaErrorInvalidValue;
    mma_ceiling_kernel<<<blocks, kMmaCeilingThreads, 0, stream>>>(seeds, out, clocks, iters);
    return cudaGetLastError();
}
