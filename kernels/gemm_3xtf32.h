// gemm_3xtf32.h — the launch API of gemm_3xtf32.cu, included by it and by its binding (torch-free).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

// C[M×N] = A[M×K] · B[K×N], all float32, row-major and contiguous, on tensor cores in TF32.
// passes = 3: the 3xTF32 split (a = a_hi + a_lo; a_lo·b_hi + a_hi·b_lo + a_hi·b_hi), float32-accurate;
// passes = 1: plain TF32 (a_hi·b_hi), for comparison. version 1 to 5 (gemm_3xtf32.cu says what each
// changed; with passes = 1, versions 1 and 2 are one kernel, and 3 and 4 another). Needs sm_80 or newer; K and N multiples
// of 4 and 16-byte-aligned A, B (slabs are loaded 16 bytes at a time).
cudaError_t launch_gemm_tf32(const float* a, const float* b, float* c, int M, int N, int K, int passes,
                             int version, cudaStream_t stream);

// A version's tiling: block tile BM×BN×BK, warp tile WM×WN, threads per block, stages, shared bytes.
struct GemmTf32Config {
    int bm, bn, bk, wm, wn, threads, stages, smem_bytes;
};
GemmTf32Config gemm_tf32_config(int version);

// The mma.sync TF32 rate with nothing else in the loop: `blocks` blocks of `threads` threads, each warp
// issuing `iters` rounds of `chains` independent m16n8k8 products (`macs` multiply-adds each);
// out holds blocks × threads floats.
struct MmaPeakConfig {
    int threads, chains, macs;
};
MmaPeakConfig mma_peak_config();
cudaError_t launch_mma_peak(float* out, int blocks, int iters, cudaStream_t stream);
