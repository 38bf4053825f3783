// conv3d_gn_mean.h — the launch API of conv3d_gn_mean.cu, included by it and by its binding (torch-free).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

// The fused kernel's arithmetic: FFMA (float32), or the tensor cores with the 3xTF32 split (sm_80+, C_out ≤ 16).
enum P27Math : int { kP27Fp32 = 0, kP27Tf32 = 1 };

// P27 fused: out[b, c] = mean over (D, H, W) of GroupNorm(hardswish(conv3d(x, w) + cb))[b, c], x (N, C_in, D, H, W),
// w (C_out, C_in, 4, 4, 4), out (N, C_out), float32 contiguous; cb, gw, gb may be null. max_smem: the opt-in
// shared memory per block to plan for (bytes); math: a P27Math.
cudaError_t launch_p27_fused(const float* x, const float* w, const float* cb, const float* gw, const float* gb,
                             float* out, int64_t N, int C_in, int D, int H, int W, int C_out, int num_groups,
                             float eps, int64_t max_smem, int math, cudaStream_t stream);

// The tail alone, from a materialised conv output y (N, C, S): out (N, C); gw, gb may be null.
cudaError_t launch_p27_tail(const float* y, const float* gw, const float* gb, float* out, int64_t N, int C,
                            int64_t S, int num_groups, float eps, cudaStream_t stream);

// Limits the binding checks before calling: filter size, output channels of the fused kernel, channels of the tail.
int p27_kernel_size();
int p27_max_out_channels(int math);
int p27_tail_max_channels();
// Shared memory the fused kernel (of that math) needs for a slab of T output depths (bytes), for a row pitch Wp.
int64_t p27_smem_bytes(int C_in, int H, int Wp, int C_out, int T, int math);
// The slab depth T for this shape and shared-memory limit; 0 when not even one output depth fits.
int p27_slab_depth(int C_in, int D, int H, int W, int C_out, int64_t max_smem, int math);
// The staged row pitch (floats) for a slab depth T.
int p27_pitch(int C_in, int H, int W, int C_out, int T, int64_t max_smem, int math);
// The compile-time constants (up to n of them into v), in the binding config()'s order; returns how many there are.
int p27_constants(int* v, int n);
