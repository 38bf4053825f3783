// group_stats.cpp — the torch binding of group_stats.cu: per-(sample, group) mean and biased variance of an
// (N, C, *) float32 tensor by one of four algorithms, and a GroupNorm forward on the Welford statistics.
//
// x is (N, C, *) — trailing dimensions flattened into S, so a Conv3d output (N, C, D, H, W) is taken as is —
// float32, contiguous, on a CUDA device; groups divides C. The pointer may have any alignment a float has.
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <climits>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "group_stats.h"
#include "torch_checks.h"

namespace {

struct Shape {
    int64_t N, C, G, S, rows, L;
};

int algo_id(const std::string& algo) {
    if (algo == "onepass") return 0;
    if (algo == "twopass") return 1;
    if (algo == "welford") return 2;
    if (algo == "welford_noshift") return 3;
    if (algo == "onepass_f64") return 4;
    KB_CHECK(false, "group_stats: algo must be one of 'onepass', 'onepass_f64', 'twopass', 'welford', ",
             "'welford_noshift', got '", algo, "'");
    return -1;
}

Shape check_input(const torch::Tensor& x, int64_t groups, const char* op) {
    kb::check_tensor(x, op, "x");
    KB_CHECK(x.dim() >= 2, op, ": x must be (N, C, *) with at least 2 dimensions, got shape ",
             kb::shape_str(x.sizes()));
    Shape s{x.size(0), x.size(1), groups, 1, 0, 0};
    for (int64_t d = 2; d < x.dim(); ++d) s.S *= x.size(d);
    KB_CHECK(groups >= 1, op, ": groups must be at least 1, got ", groups);
    KB_CHECK(s.C >= 1 && s.C % groups == 0, op, ": the channel count C = ", s.C,
             " must be a positive multiple of groups = ", groups, " (x has shape ", kb::shape_str(x.sizes()), ")");
    KB_CHECK(s.N == 0 || s.S >= 1, op, ": each group needs at least one value, got x of shape ",
             kb::shape_str(x.sizes()));
    KB_CHECK(s.N <= INT_MAX / groups, op, ": at most 2^31 - 1 (sample, group) pairs are supported, got N = ", s.N,
             " and groups = ", groups);
    s.rows = s.N * groups;
    s.L = s.C / groups * s.S;
    return s;
}

// An (N, G) statistics output: the caller's (checked) or a new one.
torch::Tensor stats_output(const torch::Tensor& x, const Shape& s, const std::optional<torch::Tensor>& out,
                           const char* op, const char* name) {
    if (!out) return torch::empty({s.N, s.G}, x.options());
    kb::check_tensor(*out, op, name);
    kb::check_shape(*out, {s.N, s.G}, op, name);
    kb::check_same_device(x, *out, op, "x", name);
    return *out;
}

void run_stats(const torch::Tensor& x, const Shape& s, torch::Tensor& mean, torch::Tensor& var, int algo,
               const char* op) {
    if (s.rows == 0) return;
    const c10::cuda::CUDAGuard guard(x.device());
    int sms = 0;
    kb::check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, x.device().index()), op,
                   "reading the device's multiprocessor count");
    const int splits = group_stats_splits(s.rows, s.L, sms);
    KB_CHECK(splits > 0, op, ": groups of ", s.L, " values are too long for the grid (at most 65535 blocks of ",
             "2^22 values per group)");
    // 4 floats per split: 3 for a Welford state, or 2 doubles (one-pass in double); 16-byte aligned
    torch::Tensor partial = torch::empty({splits > 1 ? s.rows * splits * 4 : 1}, x.options());
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
    kb::check_launch(launch_group_stats(x.data_ptr<float>(), mean.data_ptr<float>(), var.data_ptr<float>(),
                                        partial.data_ptr<float>(), s.rows, s.L, splits, algo, stream),
                     op);
}

}  // namespace

// (mean, biased variance), each (N, groups), of the (C/groups)·S values of every (sample, group).
std::vector<torch::Tensor> group_stats(const torch::Tensor& x, int64_t groups, const std::string& algo,
                                       const std::optional<torch::Tensor>& mean_out,
                                       const std::optional<torch::Tensor>& var_out) {
    constexpr const char* op = "group_stats";
    const int a = algo_id(algo);
    const Shape s = check_input(x, groups, op);
    torch::Tensor mean = stats_output(x, s, mean_out, op, "mean_out");
    torch::Tensor var = stats_output(x, s, var_out, op, "var_out");
    kb::check_no_overlap(mean, var, op, "mean_out", "var_out");
    run_stats(x, s, mean, var, a, op);
    return {mean, var};
}

// GroupNorm(x) as nn.GroupNorm computes it (biased variance), on the Welford statistics. Returns (y, mean, var).
std::vector<torch::Tensor> group_norm(const torch::Tensor& x, int64_t groups, const std::optional<torch::Tensor>& weight,
                                      const std::optional<torch::Tensor>& bias, double eps,
                                      const std::optional<torch::Tensor>& out) {
    constexpr const char* op = "group_norm";
    const Shape s = check_input(x, groups, op);
    kb::check_channel_vector(weight, x, s.C, op, "weight", "one value per channel of x");
    kb::check_channel_vector(bias, x, s.C, op, "bias", "one value per channel of x");
    KB_CHECK(eps >= 0.0, op, ": eps must be non-negative, got ", eps);
    KB_CHECK(s.N * s.C <= INT_MAX, op, ": at most 2^31 - 1 planes (N*C) are supported, got ", s.N * s.C);
    torch::Tensor y;
    if (out) {
        kb::check_tensor(*out, op, "out");
        kb::check_shape(*out, x.sizes(), op, "out");
        kb::check_same_device(x, *out, op, "x", "out");
        kb::check_no_overlap(x, *out, op, "x", "out");
        y = *out;
    } else {
        y = torch::empty_like(x);
    }
    torch::Tensor mean = torch::empty({s.N, s.G}, x.options());
    torch::Tensor var = torch::empty({s.N, s.G}, x.options());
    run_stats(x, s, mean, var, /*welford*/ 2, op);
    if (s.rows == 0) return {y, mean, var};
    const c10::cuda::CUDAGuard guard(x.device());
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
    kb::check_launch(launch_group_norm_apply(x.data_ptr<float>(), y.data_ptr<float>(), mean.data_ptr<float>(),
                                             var.data_ptr<float>(), weight ? weight->data_ptr<float>() : nullptr,
                                             bias ? bias->data_ptr<float>() : nullptr, s.N, s.C, s.G, s.S,
                                             static_cast<float>(eps), stream),
                     op);
    return {y, mean, var};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    using pybind11::arg;
    m.def("group_stats", &group_stats,
          "Per-(sample, group) mean and biased variance of x (N, C, *), by algo 'onepass' (E[x^2] - E[x]^2), "
          "'onepass_f64' (the same with sums in double), 'twopass', 'welford' (shifted by the group's first value) or 'welford_noshift'.",
          arg("x"), arg("groups"), arg("algo"), arg("mean_out") = pybind11::none(),
          arg("var_out") = pybind11::none());
    m.def("group_norm", &group_norm, "GroupNorm forward on Welford statistics; returns (y, mean, biased variance).",
          arg("x"), arg("groups"), arg("weight"), arg("bias"), arg("eps"), arg("out") = pybind11::none());
}
