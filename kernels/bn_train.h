// bn_train.h — the launch API of bn_train.cu, included by it and by its binding (torch-free).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

// Training-mode forward of y = BatchNorm2d(x)·scale, NCHW float32 (x: N×C×HW): batch statistics, the running
// statistics updated in place (momentum < 0: None, the cumulative average; running_mean, running_var and
// num_batches_tracked all null when not tracked), mean_out / var_out [C] the batch mean and biased variance.
// Workspaces: partial (bn_train_partial_floats floats), mab [4C] floats, arrivals [C] zeroed.
cudaError_t launch_bn_scale_train(const float* x, float* y, const float* weight, const float* bias,
                                  float* running_mean, float* running_var, int64_t* num_batches_tracked,
                                  float* mean_out, float* var_out, float* mab, void* partial, unsigned* arrivals,
                                  int64_t N, int64_t C, int64_t HW, int splits, float momentum, float eps,
                                  float scale, cudaStream_t stream);

// Eval-mode forward: y = BN(x)·scale with the running statistics. weight, bias may be null (γ = 1, β = 0).
cudaError_t launch_bn_scale_eval(const float* x, float* y, const float* weight, const float* bias,
                                 const float* running_mean, const float* running_var, int64_t N, int64_t C,
                                 int64_t HW, float eps, float scale, cudaStream_t stream);

// Stats blocks per channel for an (N, C, HW) input given the resident blocks of the GPU (at most one wave).
int bn_train_splits(int64_t N, int64_t C, int64_t HW, int resident_blocks);
// SMs and resident blocks per SM of the statistics kernel on the current device (occupancy API, cached).
cudaError_t bn_stats_resident_blocks(bool vec4, int* sm_count, int* blocks_per_sm);
// Whether the kernels take the float4 path for these pointers and planes (else the scalar one).
bool bn_train_vec4(const float* x, const float* y, int64_t HW);
// The compile-time constants: threads per block, loads per thread per trip, values per stats block.
void bn_train_config(int* threads, int* unroll, int64_t* max_values_per_block);
// The largest plane (H·W floats) the apply grid covers.
int64_t bn_max_plane();
// Floats of workspace for the stats blocks' partial states.
int64_t bn_train_partial_floats(int64_t C, int splits);
