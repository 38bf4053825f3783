// group_stats.h — the launch API of group_stats.cu, included by it and by its binding (torch-free).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

// Blocks per row (sample, group) of L values for a GPU of sm_count SMs; 0 when L is too long for the grid.
int group_stats_splits(int64_t rows, int64_t L, int sm_count);

// Mean and biased variance of each of `rows` contiguous rows of L floats. algo: 0 one-pass, 1 two-pass,
// 2 Welford (shifted), 3 Welford without the shift, 4 one-pass with double sums. partial: rows·splits·4 floats
// when splits > 1. Writes mean[rows] and var[rows].
cudaError_t launch_group_stats(const float* x, float* mean, float* var, float* partial, int64_t rows, int64_t L,
                               int splits, int algo, cudaStream_t stream);

// y = GroupNorm(x) from the statistics in mean/var ([N·G]): x, y (N, C, S) contiguous; weight/bias [C] or null.
cudaError_t launch_group_norm_apply(const float* x, float* y, const float* mean, const float* var, const float* weight,
                                    const float* bias, int64_t N, int64_t C, int64_t G, int64_t S, float eps,
                                    cudaStream_t stream);
