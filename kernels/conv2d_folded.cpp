// conv2d_folded.cpp — the torch binding of conv2d_folded.cu: y = conv2d(x, weight, bias), stride 1, no
// padding, NCHW float32. `conv2d_simple` takes any square kernel; `conv2d_folded` (the tiled kernel)
// is specialised for 3×3 and says so when given another size.
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <climits>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "conv2d_folded.h"
#include "torch_checks.h"

namespace {

// Validates x (N, C_in, H, W), weight (C_out, C_in, K, K), bias (C_out) and out; returns the output.
torch::Tensor checked_output(const char* op, const torch::Tensor& x, const torch::Tensor& weight,
                             const torch::Tensor& bias, const std::optional<torch::Tensor>& out) {
    KB_CHECK(x.dim() == 4, op, ": x must be 4-D (N, C_in, H, W), got ", x.dim(), "-D shape ",
             kb::shape_str(x.sizes()));
    KB_CHECK(weight.dim() == 4, op, ": weight must be 4-D (C_out, C_in, K, K), got ", weight.dim(), "-D shape ",
             kb::shape_str(weight.sizes()));
    kb::check_tensor(x, op, "x");
    kb::check_tensor(weight, op, "weight");
    kb::check_tensor(bias, op, "bias");
    kb::check_same_device(x, weight, op, "x", "weight");
    kb::check_same_device(x, bias, op, "x", "bias");
    const int64_t c_in = x.size(1), h = x.size(2), w = x.size(3), c_out = weight.size(0), k = weight.size(2);
    KB_CHECK(weight.size(1) == c_in, op, ": weight has ", weight.size(1), " input channels but x has ", c_in,
             " (weight ", kb::shape_str(weight.sizes()), ", x ", kb::shape_str(x.sizes()), ")");
    KB_CHECK(weight.size(3) == k, op, ": only square kernels are supported, got weight ",
             kb::shape_str(weight.sizes()));
    KB_CHECK(k >= 1, op, ": the kernel size must be at least 1, got weight ", kb::shape_str(weight.sizes()));
    KB_CHECK(bias.dim() == 1 && bias.size(0) == c_out, op, ": bias must have shape [", c_out,
             "] (one value per output channel), got ", kb::shape_str(bias.sizes()));
    KB_CHECK(h >= k && w >= k, op, ": the input plane ", h, "x", w, " is smaller than the ", k, "x", k,
             " kernel (no padding: the output would be empty)");
    KB_CHECK(c_in <= INT_MAX && c_out <= INT_MAX && h <= INT_MAX && w <= INT_MAX, op,
             ": channel counts and plane sizes must fit in 32 bits");
    const std::vector<int64_t> shape = {x.size(0), c_out, h - k + 1, w - k + 1};
    if (!out) return torch::empty(shape, x.options());
    kb::check_tensor(*out, op, "out");
    kb::check_shape(*out, shape, op, "out");
    kb::check_same_device(x, *out, op, "x", "out");
    kb::check_no_overlap(x, *out, op, "x", "out");
    kb::check_no_overlap(weight, *out, op, "weight", "out");
    kb::check_no_overlap(bias, *out, op, "bias", "out");
    return *out;
}

}  // namespace

// Version 1: one thread per output element; any square kernel.
torch::Tensor conv2d_simple(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                            const std::optional<torch::Tensor>& out) {
    constexpr const char* op = "conv2d_simple";
    torch::Tensor y = checked_output(op, x, weight, bias, out);
    const c10::cuda::CUDAGuard guard(x.device());
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
    kb::check_launch(launch_conv2d_simple(x.data_ptr<float>(), weight.data_ptr<float>(), bias.data_ptr<float>(),
                                          y.data_ptr<float>(), x.size(0), static_cast<int>(x.size(1)),
                                          static_cast<int>(x.size(2)), static_cast<int>(x.size(3)),
                                          static_cast<int>(weight.size(0)), static_cast<int>(weight.size(2)), stream),
                     op);
    return y;
}

// Version 2: register-blocked, tiled; 3×3 kernels only.
torch::Tensor conv2d_folded(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                            const std::optional<torch::Tensor>& out) {
    constexpr const char* op = "conv2d_folded";
    torch::Tensor y = checked_output(op, x, weight, bias, out);
    const int k = conv2d_tiled_kernel_size();
    KB_CHECK(weight.size(2) == k, op, ": the tiled kernel is specialised for ", k, "x", k, " filters, got ",
             weight.size(2), "x", weight.size(3), " (conv2d_simple takes any size)");
    const int64_t tiles = conv2d_tiled_tiles(x.size(0), static_cast<int>(x.size(2)), static_cast<int>(x.size(3)),
                                             static_cast<int>(weight.size(0)));
    KB_CHECK(tiles <= INT_MAX / 2, op, ": the output splits into ", tiles, " tiles, more than the kernel's 2^30; ",
             "split the batch");
    const c10::cuda::CUDAGuard guard(x.device());
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
    kb::check_launch(launch_conv2d_tiled(x.data_ptr<float>(), weight.data_ptr<float>(), bias.data_ptr<float>(),
                                         y.data_ptr<float>(), x.size(0), static_cast<int>(x.size(1)),
                                         static_cast<int>(x.size(2)), static_cast<int>(x.size(3)),
                                         static_cast<int>(weight.size(0)), stream),
                     op);
    return y;
}

// The tiled kernel's compile-time shape (CO_T, ROWS, GROUPS, MIN_BLOCKS, …) as a dict.
std::map<std::string, int> config() {
    const char* const* names = nullptr;
    const int* values = nullptr;
    const int n = conv2d_tiled_config(&names, &values);
    std::map<std::string, int> out;
    for (int i = 0; i < n; ++i) out[names[i]] = values[i];
    return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    using pybind11::arg;
    m.def("conv2d_simple", &conv2d_simple,
          "y = conv2d(x, weight, bias), stride 1, no padding, NCHW float32: one thread per output, any square kernel",
          arg("x"), arg("weight"), arg("bias"), arg("out") = pybind11::none());
    m.def("conv2d_folded", &conv2d_folded,
          "y = conv2d(x, weight, bias), stride 1, no padding, NCHW float32: register-blocked and tiled, 3x3 only",
          arg("x"), arg("weight"), arg("bias"), arg("out") = pybind11::none());
    m.def("config", &config, "the tiled kernel's compile-time constants: tile shape, threads, min. blocks");
}
