// bn_train.cpp — the torch binding of bn_train.cu: BatchNorm2d(x)·s in training and eval mode.
//
// Argument conventions follow torch.nn.functional.batch_norm: weight/bias may be None (affine=False);
// running_mean/running_var/num_batches_tracked are all given or all None (track_running_stats);
// momentum=None selects the cumulative moving average. The running statistics are updated in place.
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <climits>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "bn_train.h"
#include "torch_checks.h"

namespace {

constexpr const char* kOp = "bn_scale";

// x: (N, C, H, W) float32 contiguous CUDA, with at least one channel and planes the grid can cover.
int64_t check_input(const torch::Tensor& x) {
    kb::check_dim(x, 4, "(N, C, H, W)", kOp, "x");
    kb::check_tensor(x, kOp, "x");
    KB_CHECK(x.size(1) > 0, kOp, ": x must have at least one channel, got shape ", kb::shape_str(x.sizes()));
    KB_CHECK(x.size(2) * x.size(3) <= bn_max_plane(), kOp, ": planes of more than ", bn_max_plane(),
             " values (H*W) are not supported, got H*W = ", x.size(2) * x.size(3));
    KB_CHECK(x.size(0) * x.size(1) <= INT_MAX, kOp, ": at most 2^31 - 1 planes (N*C) are supported, got ",
             x.size(0) * x.size(1));
    return x.size(1);
}

// A per-channel vector: float32, contiguous, on x's device, of length C.
void check_channel_vector(const std::optional<torch::Tensor>& t, const torch::Tensor& x, const char* name) {
    kb::check_channel_vector(t, x, x.size(1), kOp, name, "one value per channel of x");
}

torch::Tensor output_for(const torch::Tensor& x, const std::optional<torch::Tensor>& out) {
    if (!out) return torch::empty_like(x);
    kb::check_tensor(*out, kOp, "out");
    kb::check_shape(*out, x.sizes(), kOp, "out");
    kb::check_same_device(x, *out, kOp, "x", "out");
    kb::check_no_overlap(x, *out, kOp, "x", "out");
    return *out;
}

const float* ptr_or_null(const std::optional<torch::Tensor>& t) { return t ? t->data_ptr<float>() : nullptr; }

}  // namespace

// Returns (y, batch mean, biased batch variance); updates the running statistics in place.
std::vector<torch::Tensor> bn_scale_train(const torch::Tensor& x, const std::optional<torch::Tensor>& weight,
                                          const std::optional<torch::Tensor>& bias,
                                          const std::optional<torch::Tensor>& running_mean,
                                          const std::optional<torch::Tensor>& running_var,
                                          const std::optional<torch::Tensor>& num_batches_tracked,
                                          std::optional<double> momentum, double eps, double scale,
                                          const std::optional<torch::Tensor>& out) {
    const int64_t C = check_input(x);
    check_channel_vector(weight, x, "weight");
    check_channel_vector(bias, x, "bias");
    check_channel_vector(running_mean, x, "running_mean");
    check_channel_vector(running_var, x, "running_var");
    const bool tracking = kb::check_bn_training(running_mean, running_var, num_batches_tracked, momentum, eps, x, kOp);
    const int64_t N = x.size(0), HW = x.size(2) * x.size(3);
    torch::Tensor y = output_for(x, out);
    if (N * HW == 0) {  // an empty batch: PyTorch returns an empty output and still counts the batch
        if (tracking) num_batches_tracked->add_(1);
        const double nan = std::numeric_limits<double>::quiet_NaN();
        return {y, torch::full({C}, nan, x.options()), torch::full({C}, nan, x.options())};
    }
    KB_CHECK(N * HW > 1, kOp, ": training mode needs more than 1 value per channel, got input of shape ",
             kb::shape_str(x.sizes()));

    const c10::cuda::CUDAGuard guard(x.device());
    int sms = 0, per_sm = 0;  // the stats grid: at most one wave, as the occupancy API counts it
    kb::check_cuda(bn_stats_resident_blocks(bn_train_vec4(x.data_ptr<float>(), y.data_ptr<float>(), HW), &sms,
                                            &per_sm),
                   kOp, "asking the occupancy of the statistics kernel");
    const int splits = bn_train_splits(N, C, HW, sms * per_sm);
    const auto fopts = x.options();
    torch::Tensor stats = torch::empty({2, C}, fopts);                       // mean, biased variance
    torch::Tensor mab = torch::empty({4, C}, fopts);  // per channel: y = ((x − m_hi) − m_lo)·a + b
    torch::Tensor partial = torch::empty({bn_train_partial_floats(C, splits)}, fopts);
    torch::Tensor arrivals = torch::zeros({C}, fopts.dtype(torch::kInt32));  // counted up by the stats kernel

    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
    kb::check_launch(
        launch_bn_scale_train(x.data_ptr<float>(), y.data_ptr<float>(), ptr_or_null(weight), ptr_or_null(bias),
                              tracking ? running_mean->data_ptr<float>() : nullptr,
                              tracking ? running_var->data_ptr<float>() : nullptr,
                              tracking ? num_batches_tracked->data_ptr<int64_t>() : nullptr,
                              stats.data_ptr<float>(), stats.data_ptr<float>() + C, mab.data_ptr<float>(),
                              partial.data_ptr(), reinterpret_cast<unsigned*>(arrivals.data_ptr<int32_t>()), N, C,
                              HW, splits, momentum ? static_cast<float>(*momentum) : -1.f, static_cast<float>(eps),
                              static_cast<float>(scale), stream),
        kOp);
    return {y, stats[0], stats[1]};
}

torch::Tensor bn_scale_eval(const torch::Tensor& x, const std::optional<torch::Tensor>& weight,
                            const std::optional<torch::Tensor>& bias, const torch::Tensor& running_mean,
                            const torch::Tensor& running_var, double eps, double scale,
                            const std::optional<torch::Tensor>& out) {
    check_input(x);
    check_channel_vector(weight, x, "weight");
    check_channel_vector(bias, x, "bias");
    check_channel_vector(running_mean, x, "running_mean");
    check_channel_vector(running_var, x, "running_var");
    KB_CHECK(eps >= 0.0, kOp, ": eps must be non-negative, got ", eps);
    torch::Tensor y = output_for(x, out);
    const c10::cuda::CUDAGuard guard(x.device());
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
    kb::check_launch(launch_bn_scale_eval(x.data_ptr<float>(), y.data_ptr<float>(), ptr_or_null(weight),
                                          ptr_or_null(bias), running_mean.data_ptr<float>(),
                                          running_var.data_ptr<float>(), x.size(0), x.size(1),
                                          x.size(2) * x.size(3), static_cast<float>(eps), static_cast<float>(scale),
                                          stream),
                     kOp);
    return y;
}

// The statistics grid bn_scale_train launches for an aligned (N, C, H, W) input on the current device.
pybind11::dict stats_grid(int64_t N, int64_t C, int64_t H, int64_t W) {
    KB_CHECK(N > 0 && C > 0 && H > 0 && W > 0 && N * H * W > 1, kOp, ": stats_grid needs a shape with more than "
             "1 value per channel");
    const int64_t HW = H * W;
    int sms = 0, per_sm = 0;
    kb::check_cuda(bn_stats_resident_blocks(HW % 4 == 0, &sms, &per_sm), kOp,
                   "asking the occupancy of the statistics kernel");
    const int splits = bn_train_splits(N, C, HW, sms * per_sm);
    pybind11::dict d;
    d["vec4"] = HW % 4 == 0;
    d["sm_count"] = sms;
    d["blocks_per_sm"] = per_sm;
    d["resident_blocks"] = sms * per_sm;
    d["splits"] = splits;
    d["blocks"] = C * splits;
    d["waves"] = static_cast<double>(C * splits) / (sms * per_sm);
    return d;
}

// The kernels' compile-time constants (threads per block, loads per thread per trip, values per stats block).
pybind11::dict config() {
    int threads = 0, unroll = 0;
    int64_t max_values = 0;
    bn_train_config(&threads, &unroll, &max_values);
    pybind11::dict d;
    d["threads"] = threads;
    d["unroll"] = unroll;
    d["max_values_per_block"] = max_values;
    d["max_plane"] = bn_max_plane();
    return d;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    using pybind11::arg;
    m.def("stats_grid", &stats_grid, "The statistics grid (splits per channel, blocks, waves) for an input shape.",
          arg("N"), arg("C"), arg("H"), arg("W"));
    m.def("config", &config, "The kernels' compile-time constants.");
    m.def("bn_scale_train", &bn_scale_train,
          "Training-mode BatchNorm2d(x) * scale with batch statistics; updates the running statistics in place. "
          "Returns (y, batch mean, biased batch variance).",
          arg("x"), arg("weight"), arg("bias"), arg("running_mean"), arg("running_var"), arg("num_batches_tracked"),
          arg("momentum"), arg("eps"), arg("scale"), arg("out") = pybind11::none());
    m.def("bn_scale_eval", &bn_scale_eval, "Eval-mode BatchNorm2d(x) * scale from the running statistics.", arg("x"),
          arg("weight"), arg("bias"), arg("running_mean"), arg("running_var"), arg("eps"), arg("scale"),
          arg("out") = pybind11::none());
}
