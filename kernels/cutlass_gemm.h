// cutlass_gemm.h — the launch API of cutlass_gemm.cu, included by it and by its binding (torch-free).
//
// NVIDIA's CUTLASS library as the yardstick for tensor cores at float32 accuracy: its Ampere GEMM
// (mma.sync, cp.async multistage), built from its headers as its example 27 builds it, in plain TF32
// (passes = 1, OpMultiplyAdd) or in its 3xTF32 split (passes = 3, OpMultiplyAddFastF32). The book chooses
// only the tile shapes. Needs sm_80 or newer.
#pragma once
#include <cuda_runtime.h>

// C[M×N] = A[M×K] · B[K×N], float32, row-major, contiguous. `tile` picks one of cutlass_gemm_tiles(passes)
// block tiles. K and N multiples of 4; A, B and C 16-byte aligned.
cudaError_t launch_cutlass_gemm(const float* a, const float* b, float* c, int M, int N, int K, int passes, int tile,
                                cudaStream_t stream);
// How many tiles there are for `passes`, and tile i's shape: block M, N, K, warp M, N, pipeline stages.
int cutlass_gemm_tiles(int passes);
void cutlass_gemm_tile(int passes, int tile, int shape[6]);
