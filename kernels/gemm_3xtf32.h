// gemm_3xtf32.h — the launch API of gemm_3xtf32.cu, included by it and by its binding (torch-free).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

// C[M×N] = A[M×K] · B[K×N], all float32, row-major and contiguous, on tensor cores in TF32.
// passes = 3: the 3xTF32 split (a = a_hi + a_lo; a_lo·b_hi + a_hi·b_lo + a_hi·b_hi), float32-accurate;
// passes = 1: plain TF32 (a_hi·b_hi), for comparison. Needs sm_80 or newer; K and N multiples of 4 and
// 16-byte-aligned A, B (tiles are staged with 16-byte copies).
cudaError_t launch_gemm_tf32(const float* a, const float* b, float* c, int M, int N, int K, int passes,
                             cudaStream_t stream);

// The tiling: block tile BM×BN×BK, warp tile WM×WN, threads per block, pipeline stages, shared bytes.
void gemm_tf32_config(int* bm, int* bn, int* bk, int* wm, int* wn, int* threads, int* stages, int* smem_bytes);
