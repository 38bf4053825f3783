// ceilings.h — the launch API of ceilings.cu, included by it and by its binding (torch-free).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

// The FFMA kernel's shape: threads per block and independent FMA chains per thread.
int ffma_threads_per_block();
int ffma_chains();
// Blocks of the FFMA kernel (ffma) or of the copy (!ffma) resident on the whole GPU at once.
cudaError_t ceilings_resident_blocks(bool ffma, int* blocks);
// y = x (n floats): `unroll` float4 per thread; a grid of resident blocks only, or one block per tile;
// `streaming` adds evict-first cache hints.
cudaError_t launch_copy(const float* x, float* y, int64_t n, int unroll, bool resident_only, bool streaming,
                        cudaStream_t stream);
// `iters` FMA steps per chain in `blocks` blocks; clocks[block] = (clock64 cycles, %globaltimer ns) of its loop.
cudaError_t launch_ffma(float* out, long long* clocks, int blocks, int iters, float m, float c,
                        cudaStream_t stream);
