// gemm_wgmma.h — the launch API of gemm_wgmma.cu, included by it and by its binding (torch-free).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

// C[M×N] = A[M×K] · B[K×N], all float32, row-major and contiguous, on Hopper's warpgroup tensor cores
// (wgmma, sm_90a), with tiles brought into shared memory by the bulk tensor copy engine (TMA).
// A split pass first writes each operand as two TF32-exact planes, K fastest (what wgmma reads for TF32):
// A → A_hi, A_lo [M × Kp]; B → B_hi, B_lo transposed [N × Kp]; Kp = K rounded up to a multiple of 4, the
// pad zero. hi = x rounded to the nearest TF32, lo = (x − hi) rounded again.
// passes = 3: a_lo·b_hi + a_hi·b_lo + a_hi·b_hi (3xTF32); passes = 1: a_hi·b_hi (plain TF32).
// version 1: one accumulator carried through all of K (chained); version 2: each 32-deep slab of K goes into
// a fresh accumulator that the threads add to the running sum in float32 (staged).
// Any M, N, K ≥ 1 and any start address: the split pass reads A and B as they are, the copy engine fills
// tiles past the edges with zeros. Needs an sm_90 GPU and a build for sm_90a (gemm_wgmma_built()).
size_t gemm_wgmma_workspace_bytes(int M, int N, int K);
cudaError_t launch_gemm_wgmma(const float* a, const float* b, float* c, int M, int N, int K, int passes,
                              int version, void* workspace, cudaStream_t stream);

// Whether the loaded binary holds the wgmma kernels (it was built for sm_90a): asked of the device code.
cudaError_t gemm_wgmma_built(bool* built);

// A version's tiling: block tile BM×BN×BK, pipeline stages, threads (one producer warpgroup, two consumer
// warpgroups), dynamic shared memory bytes.
struct GemmWgmmaConfig {
    int bm, bn, bk, stages, threads, smem_bytes;
};
GemmWgmmaConfig gemm_wgmma_config(int passes);

// The wgmma TF32 rate with nothing else in the loop: `blocks` blocks of kWgmmaCeilingThreads threads (two
// warpgroups), each warpgroup issuing `iters` rounds of 4 m64n256k8 products from its own shared-memory tiles,
// which hold random TF32 values (`seeds`: one word per thread). out: one float per thread; clocks (may be
// null): per block, SM cycles and nanoseconds of its loop (clock64, %globaltimer).
constexpr int kWgmmaCeilingThreads = 256;
constexpr int kWgmmaCeilingN = 256;
cudaError_t launch_wgmma_ceiling(const unsigned* seeds, float* out, long long* clocks, int blocks, int iters,
                                 cudaStream_t stream);
