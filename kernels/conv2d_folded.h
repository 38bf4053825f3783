// conv2d_folded.h — the launch API of conv2d_folded.cu, included by it and by its binding (torch-free).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

// y = conv2d(x, w) + b, stride 1, no padding, any square K: one thread per output (the simple kernel).
cudaError_t launch_conv2d_simple(const float* x, const float* w, const float* b, float* y, int64_t N, int C_in,
                                 int H, int W, int C_out, int K, cudaStream_t stream);
// The same for K = conv2d_tiled_kernel_size() with the tiled, persistent kernel (BN and the scale folded in w, b).
cudaError_t launch_conv2d_tiled(const float* x, const float* w, const float* b, float* y, int64_t N, int C_in,
                                int H, int W, int C_out, cudaStream_t stream);
int conv2d_tiled_kernel_size();
// The tiled kernel's compile-time constants, by name: returns their number, points names and values at them.
int conv2d_tiled_config(const char* const** names, const int** values);
// Tiles the tiled kernel's grid walks for this shape.
int64_t conv2d_tiled_tiles(int64_t N, int H, int W, int C_out);
