// torch_checks.h — argument checks shared by every binding (.cpp) of the book.
//
// Each check throws a c10::Error (a Python RuntimeError) whose message names the operation, the
// argument and what is wrong with it. Checks run in the order dtype → layout → device, so a message
// always names the first problem, and every message can be exercised without a GPU.
//
// Messages are built from strings only, by KB_CHECK. TORCH_CHECK formats any other argument (an
// integer, a double, an IntArrayRef) through a std::ostringstream created inside the extension, and
// with torch 2.11 (built with RHEL's gcc-toolset-13) loaded by an extension built with Ubuntu's GCC 13,
// that crashed the process instead of raising — seen on an H200 machine for IntArrayRef and int64_t
// arguments alike. A crash is the one outcome a bad input must never have, so bindings never pass
// non-string arguments to TORCH_CHECK: KB_CHECK converts numbers with std::to_string and hands
// TORCH_CHECK a single std::string, and an argument of any other type does not compile.
#pragma once

#include <torch/extension.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>

namespace kb {

inline std::string to_str(const char* s) { return s; }
inline std::string to_str(const std::string& s) { return s; }
template <typename T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>
std::string to_str(T v) { return std::to_string(v); }

template <typename... A>
std::string cat(const A&... parts) {
    std::string out;
    ((out += to_str(parts)), ...);
    return out;
}

#define KB_CHECK(cond, ...) TORCH_CHECK(cond, ::kb::cat(__VA_ARGS__))

inline std::string shape_str(c10::IntArrayRef s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
}

// PyTorch's Python names for the dtypes a reader meets ("float32", not c10's "Float").
inline std::string dtype_name(c10::ScalarType t) {
    switch (t) {
        case torch::kFloat32: return "float32";
        case torch::kFloat64: return "float64";
        case torch::kFloat16: return "float16";
        case torch::kBFloat16: return "bfloat16";
        case torch::kInt32: return "int32";
        case torch::kInt64: return "int64";
        default: return c10::toString(t);
    }
}

// A contiguous CUDA tensor of the given dtype.
inline void check_tensor(const torch::Tensor& t, const char* op, const char* name,
                         c10::ScalarType dtype = torch::kFloat32) {
    KB_CHECK(t.scalar_type() == dtype, op, ": ", name, " must be ", dtype_name(dtype), ", got ",
                dtype_name(t.scalar_type()));
    KB_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous, got strides ", shape_str(t.strides()),
                " for sizes ", shape_str(t.sizes()), " (call .contiguous() first)");
    KB_CHECK(t.is_cuda(), op, ": ", name, " must be a CUDA tensor, got a tensor on ", t.device().str());
}

inline void check_shape(const torch::Tensor& t, c10::IntArrayRef expected, const char* op, const char* name) {
    KB_CHECK(t.sizes() == expected, op, ": ", name, " must have shape ", shape_str(expected), ", got ",
                shape_str(t.sizes()));
}

inline void check_same_device(const torch::Tensor& a, const torch::Tensor& b, const char* op, const char* name_a,
                              const char* name_b) {
    KB_CHECK(a.device() == b.device(), op, ": ", name_a, " is on ", a.device().str(), " but ", name_b, " is on ",
                b.device().str());
}

// Kernels take __restrict__ pointers: an output may not share bytes with an input.
inline void check_no_overlap(const torch::Tensor& in, const torch::Tensor& out, const char* op, const char* in_name,
                             const char* out_name) {
    const auto* a = static_cast<const char*>(in.data_ptr());
    const auto* b = static_cast<const char*>(out.data_ptr());
    const int64_t na = in.numel() * static_cast<int64_t>(in.element_size());
    const int64_t nb = out.numel() * static_cast<int64_t>(out.element_size());
    KB_CHECK(na == 0 || nb == 0 || b + nb <= a || a + na <= b, op, ": ", out_name, " must not overlap ", in_name,
                " (the kernel's pointers are __restrict__)");
}

// A tensor of `dims` dimensions, named by their layout in the message ("(N, C, H, W)").
inline void check_dim(const torch::Tensor& t, int64_t dims, const char* layout, const char* op, const char* name) {
    KB_CHECK(t.dim() == dims, op, ": ", name, " must be ", dims, "-D ", layout, ", got ", t.dim(), "-D shape ",
             shape_str(t.sizes()));
}

// An optional per-channel vector (None passes): float32, contiguous, on x's device, of shape [C]; `what` says
// what its values are ("one value per channel of x", "one value per output channel").
inline void check_channel_vector(const std::optional<torch::Tensor>& t, const torch::Tensor& x, int64_t C,
                                 const char* op, const char* name, const char* what) {
    if (!t) return;
    check_tensor(*t, op, name);
    check_same_device(x, *t, op, "x", name);
    KB_CHECK(t->dim() == 1 && t->size(0) == C, op, ": ", name, " must have shape [", C, "] (", what, "), got ",
             shape_str(t->sizes()));
}

// A convolution's weight (C_out, C_in, k, …, k) against x (N, C_in, …): the input channels agree, and every filter
// dimension is k, the size `kernel` (named in the message: "kernel", "fused kernel") is specialised for.
inline void check_conv_weight(const torch::Tensor& x, const torch::Tensor& weight, int64_t k, const char* op,
                              const char* name, const char* kernel) {
    KB_CHECK(weight.size(1) == x.size(1), op, ": ", name, " has ", weight.size(1), " input channels but x has ",
             x.size(1), " (", name, " ", shape_str(weight.sizes()), ", x ", shape_str(x.sizes()), ")");
    bool ok = true;
    std::string filter;
    for (int64_t d = 2; d < weight.dim(); ++d) {
        ok = ok && weight.size(d) == k;
        filter += (d > 2 ? "x" : "") + std::to_string(k);
    }
    KB_CHECK(ok, op, ": the ", kernel, " is specialised for ", filter, " filters, got ", name, " ",
             shape_str(weight.sizes()));
}

// BatchNorm's training arguments: running_mean, running_var and num_batches_tracked all given or all None (the
// first two already checked as channel vectors), the counter an int64 scalar on x's device, momentum in [0, 1]
// or None, eps ≥ 0. Returns whether the running statistics are tracked.
inline bool check_bn_training(const std::optional<torch::Tensor>& running_mean,
                              const std::optional<torch::Tensor>& running_var,
                              const std::optional<torch::Tensor>& num_batches_tracked, std::optional<double> momentum,
                              double eps, const torch::Tensor& x, const char* op) {
    const bool tracking = running_mean.has_value();
    KB_CHECK(running_var.has_value() == tracking && num_batches_tracked.has_value() == tracking, op,
             ": running_mean, running_var and num_batches_tracked must be given together or all be None");
    if (tracking) {
        const auto& nbt = *num_batches_tracked;
        check_tensor(nbt, op, "num_batches_tracked", torch::kInt64);
        check_same_device(x, nbt, op, "x", "num_batches_tracked");
        KB_CHECK(nbt.numel() == 1, op, ": num_batches_tracked must hold one value, got ", nbt.numel());
    }
    KB_CHECK(!momentum || (*momentum >= 0.0 && *momentum <= 1.0), op, ": momentum must be in [0, 1] or None, got ",
             momentum ? *momentum : 0.0);
    KB_CHECK(eps >= 0.0, op, ": eps must be non-negative, got ", eps);
    return tracking;
}

inline void check_launch(cudaError_t err, const char* op) {
    KB_CHECK(err == cudaSuccess, op, ": kernel launch failed: ", cudaGetErrorString(err));
}

inline void check_cuda(cudaError_t err, const char* op, const char* what) {
    KB_CHECK(err == cudaSuccess, op, ": ", what, " failed: ", cudaGetErrorString(err));
}

}  // namespace kb
