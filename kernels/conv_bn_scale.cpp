// conv_bn_scale.cpp — the torch binding of conv_bn_scale.cu: P73 (Conv2d 3×3 → BatchNorm2d → ·s) fused.
//
// conv_bn_scale_train follows nn.BatchNorm2d in training mode: it normalises with the batch statistics and
// updates running_mean / running_var / num_batches_tracked in place (momentum None: cumulative average). These
// functions compute forward values only, in any grad mode: the differentiable ops, with their backward, wrap
// them in Python (kernelbook/models/autograd_ops.py).
// strategy "moments" takes the statistics from the input's moments and writes the output once (C_in ≤ 8);
// "inplace" writes the conv output with its statistics, then normalises it in place; "auto" (C_in ≤ 8) computes
// the moments and, from their conditioning, the moments path's predicted output error, and the GPU takes the
// in-place path for this call when it would exceed the float32 allowance (conv_moments.cuh), without a host
// synchronisation; for C_in > 8 "auto" is the in-place strategy.
// conv_bn_scale_eval is the convolution alone, for weights with BN and the scale folded in
// (kernelbook/folding.py): eval-mode P73 in one launch.
// math picks the arithmetic of the output convolution and of the moments' sums: "fp32" (FFMA), "3xtf32" (tensor
// cores; sm_80 or newer, C_in ≤ 8) or "auto" (3xtf32 where it is faster than FFMA: tc_rates.h, else fp32) —
// except where nothing guards against products that cancel, where a split product errs up to 4x an FFMA's
// (chapter 7 measures both): "auto" keeps the in-place strategy (the guard's path for such data) and eval mode (which
// has no guard) on FFMA; math="3xtf32" puts them on the tensor cores.
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <climits>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "conv_bn_scale.h"
#include "tc_rates.h"
#include "torch_checks.h"

namespace {

// Validates x (N, C_in, H, W), weight (C_out, C_in, 3, 3) and bias (C_out or None); returns the output's shape.
std::vector<int64_t> checked_shape(const char* op, const torch::Tensor& x, const torch::Tensor& weight,
                                   const std::optional<torch::Tensor>& bias) {
    kb::check_dim(x, 4, "(N, C_in, H, W)", op, "x");
    kb::check_dim(weight, 4, "(C_out, C_in, 3, 3)", op, "weight");
    kb::check_tensor(x, op, "x");
    kb::check_tensor(weight, op, "weight");
    if (bias) kb::check_tensor(*bias, op, "bias");
    kb::check_same_device(x, weight, op, "x", "weight");
    if (bias) kb::check_same_device(x, *bias, op, "x", "bias");
    const int64_t c_in = x.size(1), h = x.size(2), w = x.size(3), c_out = weight.size(0);
    const int k = cbs_kernel_size();
    kb::check_conv_weight(x, weight, k, op, "weight", "kernel");
    KB_CHECK(c_out >= 1, op, ": weight must have at least one output channel, got ", kb::shape_str(weight.sizes()));
    KB_CHECK(!bias || (bias->dim() == 1 && bias->size(0) == c_out), op, ": bias must have shape [", c_out,
             "] (one value per output channel), got ", bias ? kb::shape_str(bias->sizes()) : std::string("None"));
    KB_CHECK(h >= k && w >= k, op, ": the input plane ", h, "x", w, " is smaller than the ", k, "x", k,
             " kernel (no padding: the output would be empty)");
    KB_CHECK(c_in <= INT_MAX && c_out <= INT_MAX && h <= INT_MAX && w <= INT_MAX && x.size(0) <= INT_MAX, op,
             ": the batch, channel counts and plane sizes must fit in 32 bits");
    const int64_t tiles = cbs_tiles(x.size(0), static_cast<int>(h), static_cast<int>(w), static_cast<int>(c_out));
    KB_CHECK(tiles <= INT_MAX, op, ": the output splits into ", tiles, " tiles, more than the kernel's 2^31 - 1; ",
             "split the batch");
    return {x.size(0), c_out, h - k + 1, w - k + 1};
}

// checked_shape, and out (if given) checked; returns the output.
torch::Tensor checked_output(const char* op, const torch::Tensor& x, const torch::Tensor& weight,
                             const std::optional<torch::Tensor>& bias, const std::optional<torch::Tensor>& out) {
    const std::vector<int64_t> shape = checked_shape(op, x, weight, bias);
    if (!out) return torch::empty(shape, x.options());
    kb::check_tensor(*out, op, "out");
    kb::check_shape(*out, shape, op, "out");
    kb::check_same_device(x, *out, op, "x", "out");
    kb::check_no_overlap(x, *out, op, "x", "out");
    kb::check_no_overlap(weight, *out, op, "weight", "out");
    if (bias) kb::check_no_overlap(*bias, *out, op, "bias", "out");
    return *out;
}

// A per-channel vector: float32, contiguous, on x's device, of length C_out, not overlapping y.
void check_channel_vector(const char* op, const std::optional<torch::Tensor>& t, const torch::Tensor& x,
                          const torch::Tensor& y, const char* name) {
    if (!t) return;
    kb::check_channel_vector(t, x, y.size(1), op, name, "one value per output channel");
    kb::check_no_overlap(*t, y, op, name, "out");
}

const float* ptr_or_null(const std::optional<torch::Tensor>& t) { return t ? t->data_ptr<float>() : nullptr; }

// The output convolution's arithmetic for x on its GPU: math "auto" → 3xTF32 where it runs (sm_80 or newer,
// C_in ≤ 8) and pays (dense TF32 at least 3.5× FP32: tc_rates.h — not on sm_86/sm_89), FFMA otherwise, and
// FFMA in eval mode (no guard there: see the header); "3xtf32" where it cannot run is an error that says why.
int resolve_math(const char* op, const std::string& math, const torch::Tensor& x, bool eval = false) {
    KB_CHECK(math == "auto" || math == "fp32" || math == "3xtf32", op,
             ": math must be 'auto', 'fp32' or '3xtf32', got '", math, "'");
    if (math == "fp32" || (math == "auto" && eval)) return kCbsFp32;
    int major = 0, minor = 0;
    kb::check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, x.device().index()), op,
                   "reading the GPU's compute capability");
    kb::check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, x.device().index()), op,
                   "reading the GPU's compute capability");
    const bool gpu_ok = major >= 8, channels_ok = x.size(1) <= cbs_tf32_max_channels();
    if (math == "auto") return gpu_ok && channels_ok && kb_3xtf32_pays(major, minor) ? kCbs3xTf32 : kCbsFp32;
    KB_CHECK(gpu_ok, op, ": math='3xtf32' needs tensor cores with TF32 (sm_80 or newer); this GPU is sm_",
             major * 10 + minor, " (use math='fp32' or 'auto')");
    KB_CHECK(channels_ok, op, ": math='3xtf32' supports at most ", cbs_tf32_max_channels(),
             " input channels, got ", x.size(1), " (use math='fp32' or 'auto')");
    return kCbs3xTf32;
}

std::string math_name(int math) { return math == kCbs3xTf32 ? "3xtf32" : "fp32"; }

}  // namespace

// Eval mode: y = conv2d(x, folded_w, folded_b), stride 1, no padding.
torch::Tensor conv_bn_scale_eval(const torch::Tensor& x, const torch::Tensor& folded_w,
                                 const std::optional<torch::Tensor>& folded_b,
                                 const std::optional<torch::Tensor>& out, const std::string& math) {
    constexpr const char* op = "conv_bn_scale_eval";
    torch::Tensor y = checked_output(op, x, folded_w, folded_b, out);
    const c10::cuda::CUDAGuard guard(x.device());
    const int m = resolve_math(op, math, x, /*eval=*/true);
    if (y.numel() == 0) return y;
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
    kb::check_launch(launch_cbs_eval(x.data_ptr<float>(), folded_w.data_ptr<float>(), ptr_or_null(folded_b),
                                     y.data_ptr<float>(), x.size(0), static_cast<int>(x.size(1)),
                                     static_cast<int>(x.size(2)), static_cast<int>(x.size(3)),
                                     static_cast<int>(folded_w.size(0)), m, stream),
                     op);
    return y;
}

// Training mode: y = BN(conv2d(x, conv_w, conv_b))·scale with the batch statistics; updates the running
// statistics in place exactly as nn.BatchNorm2d does.
torch::Tensor conv_bn_scale_train(const torch::Tensor& x, const torch::Tensor& conv_w,
                                  const std::optional<torch::Tensor>& conv_b,
                                  const std::optional<torch::Tensor>& bn_w, const std::optional<torch::Tensor>& bn_b,
                                  const std::optional<torch::Tensor>& running_mean,
                                  const std::optional<torch::Tensor>& running_var,
                                  const std::optional<torch::Tensor>& num_batches_tracked,
                                  std::optional<double> momentum, double eps, double scale,
                                  const std::optional<torch::Tensor>& out, const std::string& strategy,
                                  const std::string& math) {
    constexpr const char* op = "conv_bn_scale_train";
    KB_CHECK(strategy == "auto" || strategy == "moments" || strategy == "inplace", op,
             ": strategy must be 'auto', 'moments' or 'inplace', got '", strategy, "'");
    KB_CHECK(strategy != "moments" || x.dim() != 4 || x.size(1) <= cbs_moments_max_channels(), op,
             ": the moments strategy supports at most ", cbs_moments_max_channels(), " input channels, got ",
             x.size(1), " (use strategy='inplace' or 'auto')");
    torch::Tensor y = checked_output(op, x, conv_w, conv_b, out);
    check_channel_vector(op, bn_w, x, y, "bn_w");
    check_channel_vector(op, bn_b, x, y, "bn_b");
    check_channel_vector(op, running_mean, x, y, "running_mean");
    check_channel_vector(op, running_var, x, y, "running_var");
    const bool tracking = kb::check_bn_training(running_mean, running_var, num_batches_tracked, momentum, eps, x, op);
    const int64_t N = y.size(0), C = y.size(1), HW = y.size(2) * y.size(3);
    KB_CHECK(HW <= cbs_max_plane(), op, ": output planes of more than ", cbs_max_plane(),
             " values (H*W) are not supported, got ", HW);
    KB_CHECK(N * C <= INT_MAX, op, ": at most 2^31 - 1 output planes (N*C_out) are supported, got ", N * C);
    const c10::cuda::CUDAGuard guard(x.device());
    const int m = resolve_math(op, math, x);
    if (N == 0) {  // an empty batch: like nn.BatchNorm2d, an empty output, and the batch is still counted
        if (tracking) num_batches_tracked->add_(1);
        return y;
    }
    KB_CHECK(N * HW > 1, op, ": training mode needs more than 1 value per channel, got an output of shape ",
             kb::shape_str(y.sizes()));

    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
    const auto fopts = x.options();
    const int c_in = static_cast<int>(x.size(1));
    const int m_inplace = math == "auto" ? kCbsFp32 : m;  // the in-place path: FFMA unless asked (see above)
    if (strategy == "auto" && c_in <= cbs_moments_max_channels()) {
        int64_t slots = 0;
        kb::check_cuda(cbs_train_slots(N, c_in, static_cast<int>(x.size(2)), static_cast<int>(x.size(3)),
                                       static_cast<int>(C), &slots),
                       op, "sizing the grid");
        torch::Tensor acc = torch::empty({cbs_moments_workspace()}, fopts.dtype(torch::kFloat64));
        torch::Tensor w_fold = torch::empty_like(conv_w);
        torch::Tensor b_fold = torch::empty({C}, fopts);
        torch::Tensor staged = torch::empty({2, C}, fopts);           // the moments' new running statistics
        torch::Tensor mab = torch::empty({6, C}, fopts);              // the in-place path's map and pivots
        torch::Tensor partial = torch::empty({C * slots * 3}, fopts);  // its Welford states
        kb::check_launch(
            launch_cbs_train_auto(
                x.data_ptr<float>(), conv_w.data_ptr<float>(), ptr_or_null(conv_b), y.data_ptr<float>(),
                ptr_or_null(bn_w), ptr_or_null(bn_b), tracking ? running_mean->data_ptr<float>() : nullptr,
                tracking ? running_var->data_ptr<float>() : nullptr,
                tracking ? num_batches_tracked->data_ptr<int64_t>() : nullptr, acc.data_ptr<double>(),
                w_fold.data_ptr<float>(), b_fold.data_ptr<float>(), staged.data_ptr<float>(),
                mab.data_ptr<float>(), partial.data_ptr(), slots, N, c_in, static_cast<int>(x.size(2)),
                static_cast<int>(x.size(3)), static_cast<int>(C), momentum ? static_cast<float>(*momentum) : -1.f,
                static_cast<float>(eps), static_cast<float>(scale), m, m_inplace, stream),
            op);
        return y;
    }
    if (strategy == "moments") {
        torch::Tensor acc = torch::empty({cbs_moments_workspace()}, fopts.dtype(torch::kFloat64));
        torch::Tensor w_fold = torch::empty_like(conv_w);
        torch::Tensor b_fold = torch::empty({C}, fopts);
        kb::check_launch(
            launch_cbs_train_moments(
                x.data_ptr<float>(), conv_w.data_ptr<float>(), ptr_or_null(conv_b), y.data_ptr<float>(),
                ptr_or_null(bn_w), ptr_or_null(bn_b), tracking ? running_mean->data_ptr<float>() : nullptr,
                tracking ? running_var->data_ptr<float>() : nullptr,
                tracking ? num_batches_tracked->data_ptr<int64_t>() : nullptr, acc.data_ptr<double>(),
                w_fold.data_ptr<float>(), b_fold.data_ptr<float>(), N, c_in, static_cast<int>(x.size(2)),
                static_cast<int>(x.size(3)), static_cast<int>(C), momentum ? static_cast<float>(*momentum) : -1.f,
                static_cast<float>(eps), static_cast<float>(scale), m, stream),
            op);
        return y;
    }
    int64_t slots = 0;
    kb::check_cuda(cbs_train_slots(N, static_cast<int>(x.size(1)), static_cast<int>(x.size(2)),
                                   static_cast<int>(x.size(3)), static_cast<int>(C), &slots),
                   op, "sizing the grid");
    torch::Tensor mab = torch::empty({6, C}, fopts);  // per channel: y ← ((y − m_hi) − m_lo)·a + b; pivots
    torch::Tensor partial = torch::empty({C * slots * 3}, fopts);            // Welford states (n, mean, M2)
    torch::Tensor arrivals = torch::zeros({1}, fopts.dtype(torch::kInt32));  // blocks done, counted by the kernel
    kb::check_launch(
        launch_cbs_train(x.data_ptr<float>(), conv_w.data_ptr<float>(), ptr_or_null(conv_b), y.data_ptr<float>(),
                         ptr_or_null(bn_w), ptr_or_null(bn_b), tracking ? running_mean->data_ptr<float>() : nullptr,
                         tracking ? running_var->data_ptr<float>() : nullptr,
                         tracking ? num_batches_tracked->data_ptr<int64_t>() : nullptr, mab.data_ptr<float>(),
                         partial.data_ptr(), slots, reinterpret_cast<unsigned*>(arrivals.data_ptr<int32_t>()), N,
                         static_cast<int>(x.size(1)), static_cast<int>(x.size(2)), static_cast<int>(x.size(3)),
                         static_cast<int>(C), momentum ? static_cast<float>(*momentum) : -1.f,
                         static_cast<float>(eps), static_cast<float>(scale), m_inplace, stream),
        op);
    return y;
}

// The guard of strategy="auto" on x, conv_w and BN's γ, β (None: 1, 0), ε and the scale, with the moments' sums in
// the arithmetic `math` resolves to: {"choice": "moments" | "inplace", "conv": the moments path's convolution's
// arithmetic ("fp32" where the guard predicts that the tensor cores' would cost the output its accuracy),
// "predicted": the statistics' predicted norm-wise output error, "predicted_conv": the tensor-core convolution's
// (0 when the moments' convolution is FFMA), "allowed": what they are compared with, "math": the sums'
// arithmetic}. Runs the statistics and the guard, then one host synchronisation to read them: for inspection and
// tests; the training call itself never waits. C_in > 8: the in-place path, nothing predicted (NaN).
static pybind11::dict run_guard(const char* op, const torch::Tensor& x, const torch::Tensor& conv_w,
                                const std::optional<torch::Tensor>& conv_b, const std::string& math,
                                const std::optional<torch::Tensor>& bn_w,
                                const std::optional<torch::Tensor>& bn_b, double eps, double scale) {
    const std::vector<int64_t> shape = checked_shape(op, x, conv_w, conv_b);
    const int m = resolve_math(op, math, x);
    pybind11::dict out;
    out["math"] = math_name(m);
    if (x.size(1) > cbs_moments_max_channels()) {
        out["choice"] = "inplace";
        out["conv"] = math_name(m);
        out["predicted"] = std::nan("");
        out["predicted_conv"] = std::nan("");
        out["allowed"] = std::nan("");
        return out;
    }
    KB_CHECK(shape[0] >= 1, op, ": x holds no samples");
    KB_CHECK(eps >= 0.0, op, ": eps must be non-negative, got ", eps);
    kb::check_channel_vector(bn_w, x, shape[1], op, "bn_w", "one value per output channel");
    kb::check_channel_vector(bn_b, x, shape[1], op, "bn_b", "one value per output channel");
    const c10::cuda::CUDAGuard guard(x.device());
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
    const auto fopts = x.options();
    torch::Tensor acc = torch::empty({cbs_moments_workspace()}, fopts.dtype(torch::kFloat64));
    torch::Tensor w_fold = torch::empty_like(conv_w);
    torch::Tensor b_fold = torch::empty({shape[1]}, fopts);
    kb::check_launch(launch_cbs_guard_probe(x.data_ptr<float>(), conv_w.data_ptr<float>(), ptr_or_null(conv_b),
                                            ptr_or_null(bn_w), ptr_or_null(bn_b), acc.data_ptr<double>(),
                                            w_fold.data_ptr<float>(), b_fold.data_ptr<float>(), x.size(0),
                                            static_cast<int>(x.size(1)), static_cast<int>(x.size(2)),
                                            static_cast<int>(x.size(3)), static_cast<int>(shape[1]),
                                            static_cast<float>(eps), static_cast<float>(scale), m, stream),
                     op);
    const int64_t p = cbs_guard_prediction_offset();
    const torch::Tensor pred = acc.slice(0, p, p + 3).cpu();
    const int flag = acc.slice(0, cbs_guard_offset(), cbs_guard_offset() + 1).view(torch::kInt32)[0].item<int>();
    out["choice"] = flag == 1 ? "inplace" : "moments";
    out["conv"] = flag == 2 ? "fp32" : math_name(m);
    out["predicted"] = pred[0].item<double>();
    out["allowed"] = pred[1].item<double>();
    out["predicted_conv"] = pred[2].item<double>();
    return out;
}

pybind11::dict conv_bn_scale_guard(const torch::Tensor& x, const torch::Tensor& conv_w,
                                   const std::optional<torch::Tensor>& conv_b, const std::string& math,
                                   const std::optional<torch::Tensor>& bn_w, const std::optional<torch::Tensor>& bn_b,
                                   double eps, double scale) {
    return run_guard("conv_bn_scale_guard", x, conv_w, conv_b, math, bn_w, bn_b, eps, scale);
}

// Which path strategy="auto" takes: "moments" or "inplace" (conv_bn_scale_guard's choice).
std::string conv_bn_scale_auto_choice(const torch::Tensor& x, const torch::Tensor& conv_w,
                                      const std::optional<torch::Tensor>& conv_b, const std::string& math,
                                      const std::optional<torch::Tensor>& bn_w,
                                      const std::optional<torch::Tensor>& bn_b, double eps, double scale) {
    const pybind11::dict g = run_guard("conv_bn_scale_auto_choice", x, conv_w, conv_b, math, bn_w, bn_b, eps, scale);
    return pybind11::cast<std::string>(g["choice"]);
}

// The guard's error model for the moments' sums in FFMA ('fp32') or on the tensor cores ('3xtf32').
pybind11::dict guard_model(const std::string& math) {
    KB_CHECK(math == "fp32" || math == "3xtf32", "guard_model", ": math must be 'fp32' or '3xtf32', got '", math,
             "'");
    double v[5];
    cbs_guard_model(math == "3xtf32" ? kCbs3xTf32 : kCbsFp32, v);
    pybind11::dict out;
    out["u"] = v[0];
    out["floor"] = v[1];
    out["spread"] = v[2];
    out["allowance"] = v[3];
    out["conv_unit"] = v[4];
    return out;
}

// The arithmetic math='auto' (or the given math) picks for x on its GPU in mode 'train' (the moments strategy's
// output convolution) or 'eval': 'fp32' or '3xtf32'.
std::string conv_bn_scale_math(const torch::Tensor& x, const std::string& math, const std::string& mode) {
    constexpr const char* op = "conv_bn_scale_math";
    KB_CHECK(mode == "train" || mode == "eval", op, ": mode must be 'train' or 'eval', got '", mode, "'");
    kb::check_dim(x, 4, "(N, C_in, H, W)", op, "x");
    kb::check_tensor(x, op, "x");
    return math_name(resolve_math(op, math, x, mode == "eval"));
}

// The tensor-core convolution's instruction on x's GPU: "wgmma" (an sm_90a build on an sm_90 GPU) or "mma.sync";
// mma_sync = true forces mma.sync from now on (for comparisons: the outputs are bitwise the same), false lets the
// GPU's default choose again. Returns the instruction the next 3xTF32 convolution uses.
std::string conv_bn_scale_tc_instruction(const torch::Tensor& x, std::optional<bool> mma_sync) {
    constexpr const char* op = "conv_bn_scale_tc_instruction";
    kb::check_tensor(x, op, "x");
    const c10::cuda::CUDAGuard guard(x.device());
    const int r = cbs_tc_instruction(mma_sync ? (*mma_sync ? 1 : 0) : -1);
    KB_CHECK(r >= 0, op, ": could not ask the GPU which tensor-core kernel it runs");
    return (r & 1) ? "wgmma" : "mma.sync";
}
// The compile-time configuration: rows per thread, channels per thread, channel groups, warp rows, minimum
// blocks per SM, cp.async staging, dynamic shared memory bytes (eval, train).
std::vector<int64_t> conv_bn_scale_config() {
    int c[8];
    cbs_config(c);
    return {c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    using pybind11::arg;
    m.def("conv_bn_scale_train", &conv_bn_scale_train,
          "Training-mode BatchNorm2d(conv2d(x, conv_w, conv_b)) * scale (3x3, stride 1, no padding) with batch "
          "statistics; updates the running statistics in place",
          arg("x"), arg("conv_w"), arg("conv_b"), arg("bn_w"), arg("bn_b"), arg("running_mean"), arg("running_var"),
          arg("num_batches_tracked"), arg("momentum"), arg("eps"), arg("scale"), arg("out") = pybind11::none(),
          arg("strategy") = "auto", arg("math") = "auto");
    m.def("conv_bn_scale_eval", &conv_bn_scale_eval,
          "conv2d(x, folded_w, folded_b), 3x3, stride 1, no padding: eval-mode P73 with BN and the scale folded in",
          arg("x"), arg("folded_w"), arg("folded_b"), arg("out") = pybind11::none(), arg("math") = "auto");
    m.def("conv_bn_scale_math", &conv_bn_scale_math,
          "The output convolution's arithmetic that `math` resolves to for x on its GPU in `mode`: 'fp32' (FFMA) "
          "or '3xtf32' (tensor cores; in training mode math='auto' picks it where dense TF32 runs at least 3.5x "
          "FP32, tc_rates.h, and C_in <= 8; in eval mode, which has no guard against cancelling products, FFMA)",
          arg("x"), arg("math") = "auto", arg("mode") = "train");
    m.def("conv_bn_scale_guard", &conv_bn_scale_guard,
          "The guard of strategy='auto' on this batch, filter and BatchNorm: {'choice', 'conv' (the moments "
          "path's convolution's arithmetic), 'predicted' (the statistics' predicted norm-wise output error), "
          "'predicted_conv' (the tensor-core convolution's), 'allowed' (the float32 allowance they are compared "
          "with), 'math' (the moments' sums' arithmetic)} (synchronises: for inspection)",
          arg("x"), arg("conv_w"), arg("conv_b") = pybind11::none(), arg("math") = "auto",
          arg("bn_w") = pybind11::none(), arg("bn_b") = pybind11::none(), arg("eps") = 1e-5, arg("scale") = 1.0);
    m.def("conv_bn_scale_auto_choice", &conv_bn_scale_auto_choice,
          "The path strategy='auto' takes for this batch and filter: 'moments', or 'inplace' when the moments' "
          "predicted output error exceeds the float32 allowance (conv_bn_scale_guard; synchronises: for inspection)",
          arg("x"), arg("conv_w"), arg("conv_b") = pybind11::none(), arg("math") = "auto",
          arg("bn_w") = pybind11::none(), arg("bn_b") = pybind11::none(), arg("eps") = 1e-5, arg("scale") = 1.0);
    m.def("guard_model", &guard_model,
          "The guard's error model for the moments' sums in `math` ('fp32' or '3xtf32'): {'u', 'floor', 'spread', "
          "'allowance', 'conv_unit'}; the variance of a channel errs by about u*sqrt(floor^2 + (spread*rho)^2), "
          "the moments are taken while the predicted output error is at most allowance*u*sqrt(C_in*9), and their "
          "convolution stays on the tensor cores while that with its own error (a product errs about conv_unit*u "
          "of |w*x|) is too",
          arg("math"));
    m.def("conv_bn_scale_tc_instruction", &conv_bn_scale_tc_instruction,
          "The 3xTF32 convolution's instruction on x's GPU: 'wgmma' (sm_90a build, sm_90 GPU) or 'mma.sync'; "
          "mma_sync=True forces mma.sync (bitwise the same output), False restores the default",
          arg("x"), arg("mma_sync") = pybind11::none());
    m.def("config", &conv_bn_scale_config,
          "[RPT, CO_T, GROUPS, WROWS, MIN_BLOCKS, ASYNC, smem bytes eval, smem bytes train] of this build");
}
