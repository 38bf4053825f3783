// conv_bn_scale.h — the launch API of conv_bn_scale.cu, included by it and by its binding (torch-free).
//
// P73: y = BatchNorm2d(conv2d(x, w, b))·scale, 3×3 filters, stride 1, no padding, NCHW float32. x is
// (N, C_in, H, W), w (C_out, C_in, 3, 3), b (C_out) or null; gamma, beta may be null (γ = 1, β = 0);
// running_mean, running_var, num_batches_tracked all null when not tracked; momentum < 0: None.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

// The arithmetic of the output convolution and of the moments' sums: FFMA in float32, or the 3xTF32 split on the
// tensor cores (conv_tf32.cuh, conv_moments.cuh: sm_80 or newer, C_in ≤ cbs_tf32_max_channels()). The in-place
// training strategy gathers its statistics in the FFMA convolution's epilogue, or in a pass over y after the
// tensor-core convolution.
enum CbsMath : int { kCbsFp32 = 0, kCbs3xTf32 = 1 };

// Eval mode: y = conv(x, w) + b (w, b folded from BN and the scale by the caller; b may be null).
cudaError_t launch_cbs_eval(const float* x, const float* w, const float* b, float* y, int64_t N, int C_in, int H,
                            int W, int C_out, int math, cudaStream_t stream);

// Training mode, in place: y = conv(x, w) + b with per-channel statistics, then y ← BN(y)·s in place.
// Workspaces: partial [C_out · slots] Welford states (slots from cbs_train_slots), mab [6·C_out] (the map and the
// channels' pivots), arrivals [1] zeroed.
cudaError_t launch_cbs_train(const float* x, const float* w, const float* b, float* y, const float* gamma,
                             const float* beta, float* running_mean, float* running_var,
                             int64_t* num_batches_tracked, float* mab, void* partial, int64_t slots,
                             unsigned* arrivals, int64_t N, int C_in, int H, int W, int C_out, float momentum,
                             float eps, float scale, int math, cudaStream_t stream);

// Training mode from the input's moments (C_in ≤ cbs_moments_max_channels()): statistics, running statistics and
// the folded weights w_fold (C_out·C_in·9), b_fold (C_out), then the eval convolution on them. acc:
// cbs_moments_workspace() doubles.
cudaError_t launch_cbs_train_moments(const float* x, const float* w, const float* b, float* y, const float* gamma,
                                     const float* beta, float* running_mean, float* running_var,
                                     int64_t* num_batches_tracked, double* acc, float* w_fold, float* b_fold,
                                     int64_t N, int C_in, int H, int W, int C_out, float momentum, float eps,
                                     float scale, int math, cudaStream_t stream);

// "auto" (C_in ≤ 8): the moments with the guard, then both strategies' launches, gated on the GPU by the guard's
// flag (no host synchronisation). Workspaces: those of both strategies, and staged [2·C_out] floats when the
// running statistics are tracked.
cudaError_t launch_cbs_train_auto(const float* x, const float* w, const float* b, float* y, const float* gamma,
                                  const float* beta, float* running_mean, float* running_var,
                                  int64_t* num_batches_tracked, double* acc, float* w_fold, float* b_fold,
                                  float* staged, float* mab, void* partial, int64_t slots, int64_t N, int C_in,
                                  int H, int W, int C_out, float momentum, float eps, float scale, int math,
                                  int inplace_math, cudaStream_t stream);

// The guard alone, with the moments' sums in the given arithmetic, for BN's γ, β (null: 1, 0), ε and the scale:
// once the stream has run, the flag is acc[cbs_guard_offset()]'s first 32-bit word (0 the moments, 1 in place, 2
// the moments with the FFMA convolution), and the statistics' predicted output error, the allowance and the
// tensor-core convolution's predicted error are acc[cbs_guard_prediction_offset()] and the two doubles after it.
cudaError_t launch_cbs_guard_probe(const float* x, const float* w, const float* b, const float* gamma,
                                   const float* beta, double* acc, float* w_fold, float* b_fold, int64_t N, int C_in,
                                   int H, int W, int C_out, float eps, float scale, int math, cudaStream_t stream);

// The most input channels the 3xTF32 convolution takes (8: one mma k-step per filter tap).
int cbs_tf32_max_channels();
// The filter size the kernels are specialised for (3).
int cbs_kernel_size();
// The largest output plane (HO·WO floats) the in-place apply's grid covers.
int64_t cbs_max_plane();
// Tiles of the output (0 for an empty one); the binding checks the count fits 31 bits.
int64_t cbs_tiles(int64_t N, int H, int W, int C_out);
// Partial-state slots per channel of the in-place training launch on the current device.
cudaError_t cbs_train_slots(int64_t N, int C_in, int H, int W, int C_out, int64_t* slots);
// The compile-time configuration: RPT, CO_T, GROUPS, WROWS, MIN_BLOCKS, ASYNC, smem bytes (eval, train).
void cbs_config(int* out);

// The tensor-core convolution's instruction on the current GPU: bit 0 set for wgmma (an sm_90a build on an sm_90
// GPU), clear for mma.sync; -1 on an error. mma_sync ≥ 0 first sets whether mma.sync is forced (for comparisons:
// the two give bitwise the same output); bit 1 of the result says whether it was forced before the call.
int cbs_tc_instruction(int mma_sync);
// The moments strategy's limits: input channels, workspace doubles, the offsets of the guard's flag and of its
// prediction in it, and the guard's model for the sums' arithmetic, out[4] = {u, floor, spread, allowance factor}:
// "auto" takes the moments while ½·u·√(Σ_c (γ_c s)²·(floor² + spread²·ρ_c²)/Σ_c (γ_c s)²) ≤ factor·u·√(C_in·9)
// (conv_moments.cuh says what ρ_c is and where ε enters).
int cbs_moments_max_channels();
int64_t cbs_moments_workspace();
int64_t cbs_guard_offset();
int64_t cbs_guard_prediction_offset();
void cbs_guard_model(int math, double* out);
