// mappings.h — the launch API of mappings.cu, included by it and by its binding (torch-free).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

// y = x·a[c] + b[c] over an (n, c, h, w) float32 tensor with thread mapping `mapping`:
// 0 flat, 1 flat_vec4, 2 channel_fastest, 3 pixel_loop, 4 tile_7x18x4, 5 tile_8x8x8, 6 rows_w_x4,
// 7 channel_fastest_smem, 8 flat_x4, 9 flat_vec4_x4, 10 planes_vec4_x4, 11 flat_vec4_x4_i32.
// a and b are host arrays of c floats (c <= mappings_max_channels()). Returns the launch's error; nothing is
// launched for an empty tensor.
cudaError_t launch_affine(int mapping, const float* x, float* y, const float* a, const float* b, int64_t n,
                          int64_t c, int64_t h, int64_t w, cudaStream_t stream);

// The launch constants: channels the parameter block holds, threads per block of the flat mappings, loads per
// thread of the unrolled ones.
int mappings_max_channels();
int mappings_flat_threads();
int mappings_unroll();
