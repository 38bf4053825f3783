// cutlass_conv.cu — CUTLASS's Ampere 3xTF32 implicit-GEMM convolutions (forward, 2-D and 3-D), the yardstick
// beside conv_bn_scale.cu and conv3d_gn_mean.cu.
//
// Nothing here is the book's own algorithm: cutlass::conv::kernel::DefaultConv{2,3}dFprop with the operator tag
// OpMultiplyAddFastF32 (3xTF32, one accumulator through all of K, as cutlass_gemm.cu describes) and its epilogue
// LinearCombination with beta-free scaling: D = acc + C, where C is the bias read with stride 0, so every output
// pixel adds bias[k]. The GEMM it runs: M = output pixels, N = output channels, K = filter taps × input channels.
#include <cutlass/cutlass.h>
#include <cutlass/conv/kernel/default_conv2d_fprop.h>
#include <cutlass/conv/kernel/default_conv3d_fprop.h>
#include <cutlass/conv/device/implicit_gemm_convolution.h>  // after the problem sizes it names

#include "cutlass_conv.h"

namespace {

using Block = cutlass::gemm::GemmShape<128, 64, 16>;  // CUTLASS's example 28: 128 pixels × 64 channels
using Warp = cutlass::gemm::GemmShape<64, 32, 16>;
using Mma = cutlass::gemm::GemmShape<16, 8, 8>;       // mma.sync m16n8k8, TF32
using BiasEpilogue = cutlass::epilogue::thread::LinearCombination<float, 4, float, float,
                                                                  cutlass::epilogue::thread::ScaleType::NoBetaScaling>;
using Swizzle = cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<>;
using Fast = cutlass::arch::OpMultiplyAddFastF32;
constexpr int kStages = 3;

template <cutlass::conv::IteratorAlgorithm Iter>
using Conv2d = cutlass::conv::device::ImplicitGemmConvolution<typename cutlass::conv::kernel::DefaultConv2dFprop<
    float, cutlass::layout::TensorNHWC, float, cutlass::layout::TensorNHWC, float, cutlass::layout::TensorNHWC, float,
    cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80, Block, Warp, Mma, BiasEpilogue, Swizzle, kStages, Fast, Iter,
    cutlass::conv::StrideSupport::kUnity, 4, 4>::Kernel>;

// P27 has 16 output channels: a 64-channel block would leave three quarters of its columns idle.
using Block3 = cutlass::gemm::GemmShape<128, 16, 16>;
using Warp3 = cutlass::gemm::GemmShape<64, 16, 16>;  // two warps: 64 threads copy the 16×16 filter tile once
using Conv3d = cutlass::conv::device::ImplicitGemmConvolution<typename cutlass::conv::kernel::DefaultConv3dFprop<
    float, cutlass::layout::TensorNDHWC, float, cutlass::layout::TensorNDHWC, float, cutlass::layout::TensorNDHWC,
    float, cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80, Block3, Warp3, Mma, BiasEpilogue, Swizzle, kStages, Fast,
    cutlass::conv::IteratorAlgorithm::kOptimized>::Kernel>;

template <typename Op>
cudaError_t run(const typename Op::Arguments& args, cudaStream_t stream) {
    Op op;
    if (op.can_implement(args) != cutlass::Status::kSuccess) return cudaErrorInvalidValue;
    if (Op::get_workspace_size(args) != 0) return cudaErrorInvalidValue;  // no split-K: none needed
    if (op.initialize(args, nullptr, stream) != cutlass::Status::kSuccess) return cudaErrorInvalidConfiguration;
    if (op(stream) != cutlass::Status::kSuccess) return cudaErrorLaunchFailure;
    return cudaGetLastError();
}

template <cutlass::conv::IteratorAlgorithm Iter>
cudaError_t conv2d(const float* x, const float* w, const float* bias, float* y, int N, int H, int W, int C, int K,
                   int R, int S, cudaStream_t stream) {
    using Op = Conv2d<Iter>;
    using Layout = cutlass::layout::TensorNHWC;
    const int P = H - R + 1, Q = W - S + 1;
    const cutlass::conv::Conv2dProblemSize problem({N, H, W, C}, {K, R, S, C}, {0, 0, 0, 0}, {1, 1}, {1, 1},
                                                  {N, P, Q, K}, cutlass::conv::Mode::kCrossCorrelation, 1);
    const typename Op::Arguments args(
        problem, {const_cast<float*>(x), Layout::packed({N, H, W, C})},
        {const_cast<float*>(w), Layout::packed({K, R, S, C})}, {const_cast<float*>(bias), Layout::Stride(0)},
        {y, Layout::packed({N, P, Q, K})}, {1.0f});
    return run<Op>(args, stream);
}

}  // namespace

cudaError_t launch_cutlass_conv2d(const float* x, const float* w, const float* bias, float* y, int N, int H, int W,
                                  int C, int K, int R, int S, int iterator, cudaStream_t stream) {
    if (iterator == 0) return conv2d<cutlass::conv::IteratorAlgorithm::kOptimized>(x, w, bias, y, N, H, W, C, K, R, S,
                                                                                    stream);
    if (iterator == 1) return conv2d<cutlass::conv::IteratorAlgorithm::kFewChannels>(x, w, bias, y, N, H, W, C, K, R,
                                                                                      S, stream);
    return cudaErrorInvalidValue;
}

cudaError_t launch_cutlass_conv3d(const float* x, const float* w, const float* bias, float* y, int N, int D, int H,
                                  int W, int C, int K, int T, int R, int S, cudaStream_t stream) {
    using Layout = cutlass::layout::TensorNDHWC;
    const int Z = D - T + 1, P = H - R + 1, Q = W - S + 1;
    const cutlass::conv::Conv3dProblemSize problem({N, D, H, W, C}, {K, T, R, S, C}, cutlass::make_Coord(0, 0, 0),
                                                  cutlass::make_Coord(1, 1, 1), cutlass::make_Coord(1, 1, 1),
                                                  {N, Z, P, Q, K}, cutlass::conv::Mode::kCrossCorrelation, 1);
    const typename Conv3d::Arguments args(
        problem, {const_cast<float*>(x), Layout::packed({N, D, H, W, C})},
        {const_cast<float*>(w), Layout::packed({K, T, R, S, C})}, {const_cast<float*>(bias), Layout::Stride(0)},
        {y, Layout::packed({N, Z, P, Q, K})}, {1.0f});
    return run<Conv3d>(args, stream);
}
