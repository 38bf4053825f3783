// cutlass_conv.h — the launch API of cutlass_conv.cu, included by it and by its binding (torch-free).
//
// NVIDIA's CUTLASS library as the yardstick for a float32-accurate tensor-core convolution: its Ampere
// implicit-GEMM convolution forward (mma.sync, cp.async multistage) in its 3xTF32 split
// (OpMultiplyAddFastF32), built from its headers as its example 28 builds it, with a per-channel bias in
// its epilogue. Channels-last layouts only (CUTLASS's convolutions have no NCHW form). Needs sm_80 or newer.
#pragma once
#include <cuda_runtime.h>

// y = conv2d(x, w) + bias[k]: cross-correlation, stride 1, no padding; x NHWC [N, H, W, C], w KRSC
// [K, R, S, C], y NPQK [N, H-R+1, W-S+1, K]. C and K multiples of 4. `iterator` 0 is CUTLASS's
// kOptimized (each K-step within one filter tap), 1 its kFewChannels (a K-step spans taps, for small C).
cudaError_t launch_cutlass_conv2d(const float* x, const float* w, const float* bias, float* y, int N, int H, int W,
                                  int C, int K, int R, int S, int iterator, cudaStream_t stream);

// y = conv3d(x, w) + bias[k]: the same in three dimensions; x NDHWC, w KTRSC, y NZPQK; C and K multiples of 4.
cudaError_t launch_cutlass_conv3d(const float* x, const float* w, const float* bias, float* y, int N, int D, int H,
                                  int W, int C, int K, int T, int R, int S, cudaStream_t stream);
