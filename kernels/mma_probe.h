// mma_probe.h — the launch API of mma_probe.cu, included by it and by its binding (torch-free).
#pragma once
#include <cuda_runtime.h>

// One mma.sync.m16n8k8 TF32 product by one warp: D[16×8] = A[16×8]·B[8×8] + C[16×8], all float32 row-major.
// round = 0 hands the tensor core the float32 bits as they are; round = 1 rounds each operand to TF32 with
// cvt.rna first (to nearest, ties away), as the book's split does.
cudaError_t launch_mma_probe(const float* a, const float* b, const float* c, float* d, int round,
                             cudaStream_t stream);

// The TF32 mma.sync rate with operands that vary: `blocks` blocks of kMmaCeilingThreads threads, each warp
// issuing `iters` rounds of kMmaCeilingChains independent m16n8k8 products whose A and B fragments are the
// thread's own random bits (`seeds`, 6 words per thread of the first block), not constants. out: one float
// per thread; clocks (may be null): per block, SM cycles and nanoseconds of its loop (clock64, %globaltimer).
constexpr int kMmaCeilingThreads = 256;
constexpr int kMmaCeilingChains = 8;
cudaError_t launch_mma_ceiling(const unsigned* seeds, float* out, long long* clocks, int blocks, int iters,
                               cudaStream_t stream);
