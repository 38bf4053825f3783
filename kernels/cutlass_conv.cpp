// cutlass_conv.cpp — the torch binding of cutlass_conv.cu: validate, allocate, launch on PyTorch's stream.
//
// Tensors keep PyTorch's logical shapes — x (N, C, H, W), w (K, C, R, S) — in channels-last memory
// (x.contiguous(memory_format=torch.channels_last)), which is CUTLASS's NHWC and KRSC; y comes back the same way.
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <climits>
#include <cstdint>

#include "cutlass_conv.h"
#include "sm_checks.h"
#include "torch_checks.h"

namespace {

// float32, channels-last, on CUDA, 16-byte aligned: what CUTLASS's iterators read.
void check_channels_last(const torch::Tensor& t, int64_t dims, const char* op, const char* name) {
    const bool three = dims == 5;
    KB_CHECK(t.scalar_type() == torch::kFloat32, op, ": ", name, " must be float32, got ",
             kb::dtype_name(t.scalar_type()));
    kb::check_dim(t, dims, three ? "(N, C, D, H, W)" : "(N, C, H, W)", op, name);
    KB_CHECK(t.is_contiguous(three ? at::MemoryFormat::ChannelsLast3d : at::MemoryFormat::ChannelsLast), op, ": ",
             name, " must be channels-last (CUTLASS's ", three ? "NDHWC" : "NHWC", "): call .contiguous(memory_format=",
             three ? "torch.channels_last_3d" : "torch.channels_last", ") first");
    KB_CHECK(t.is_cuda(), op, ": ", name, " must be a CUDA tensor, got a tensor on ", t.device().str());
    kb::check_aligned16(t, op, name);
    KB_CHECK(t.numel() <= INT_MAX, op, ": ", name, " is too large for CUTLASS's 32-bit indices");
}

// x, w and bias agree; returns the output's shape (N, K, spatial...).
std::vector<int64_t> check_conv(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias,
                                int64_t dims, const char* op) {
    check_channels_last(x, dims, op, "x");
    check_channels_last(w, dims, op, "weight");
    kb::check_same_device(x, w, op, "x", "weight");
    const int64_t C = x.size(1), K = w.size(0);
    KB_CHECK(w.size(1) == C, op, ": weight has ", w.size(1), " input channels but x has ", C);
    KB_CHECK(C % 4 == 0 && K % 4 == 0, op, ": input and output channels must be multiples of 4 (CUTLASS copies ",
             "16 bytes at a time), got ", C, " and ", K, " (pad with zero channels)");
    kb::check_channel_vector(bias, x, K, op, "bias", "one value per output channel");
    std::vector<int64_t> out{x.size(0), K};
    for (int64_t d = 2; d < dims; ++d) {
        KB_CHECK(w.size(d) <= x.size(d), op, ": the filter (", kb::shape_str(w.sizes()), ") is larger than x (",
                 kb::shape_str(x.sizes()), ")");
        out.push_back(x.size(d) - w.size(d) + 1);
    }
    kb::require_tf32_tensor_cores(x, op);
    return out;
}

}  // namespace

// y = conv2d(x, w) + bias with CUTLASS's 3xTF32 implicit GEMM (stride 1, no padding), channels-last.
torch::Tensor cutlass_conv2d(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias,
                             int64_t iterator) {
    constexpr const char* op = "cutlass_conv2d";
    KB_CHECK(iterator == 0 || iterator == 1, op, ": iterator must be 0 (kOptimized) or 1 (kFewChannels), got ",
             iterator);
    const c10::cuda::CUDAGuard guard(x.device());
    const auto shape = check_conv(x, w, bias, 4, op);
    auto y = torch::empty(shape, x.options().memory_format(at::MemoryFormat::ChannelsLast));
    if (y.numel() == 0) return y;
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
    kb::check_launch(launch_cutlass_conv2d(x.data_ptr<float>(), w.data_ptr<float>(), bias.data_ptr<float>(),
                                           y.data_ptr<float>(), x.size(0), x.size(2), x.size(3), x.size(1),
                                           w.size(0), w.size(2), w.size(3), static_cast<int>(iterator), stream),
                     op);
    return y;
}

// y = conv3d(x, w) + bias with CUTLASS's 3xTF32 implicit GEMM (stride 1, no padding), channels-last-3d.
torch::Tensor cutlass_conv3d(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias) {
    constexpr const char* op = "cutlass_conv3d";
    const c10::cuda::CUDAGuard guard(x.device());
    const auto shape = check_conv(x, w, bias, 5, op);
    auto y = torch::empty(shape, x.options().memory_format(at::MemoryFormat::ChannelsLast3d));
    if (y.numel() == 0) return y;
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
    kb::check_launch(launch_cutlass_conv3d(x.data_ptr<float>(), w.data_ptr<float>(), bias.data_ptr<float>(),
                                           y.data_ptr<float>(), x.size(0), x.size(2), x.size(3), x.size(4),
                                           x.size(1), w.size(0), w.size(2), w.size(3), w.size(4), stream),
                     op);
    return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("cutlass_conv2d", &cutlass_conv2d,
          "conv2d(x, weight) + bias, stride 1, no padding, with CUTLASS's 3xTF32 implicit GEMM; x and weight "
          "channels-last; iterator 0 = kOptimized, 1 = kFewChannels",
          pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("bias"), pybind11::arg("iterator") = 1);
    m.def("cutlass_conv3d", &cutlass_conv3d,
          "conv3d(x, weight) + bias, stride 1, no padding, with CUTLASS's 3xTF32 implicit GEMM; x and weight "
          "channels-last-3d",
          pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("bias"));
}
