// scale.h — the launch API of scale.cu, included by it and by its binding (torch-free).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

// Launches y[i] = s * x[i] for i < n on `stream`. x and y must not overlap.
// Returns the launch's error (cudaSuccess when nothing was launched because n == 0).
cudaError_t launch_scale(const float* x, float* y, float s, int64_t n, cudaStream_t stream);

// The tiling constants: threads per block, float4 loads per thread, bytes per vector access.
void scale_config(int* threads, int* unroll, int* vec_bytes);
