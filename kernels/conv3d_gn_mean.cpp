// conv3d_gn_mean.cpp — the torch binding of conv3d_gn_mean.cu.
//   p27_forward(x, conv_weight, conv_bias, gn_weight, gn_bias, num_groups, eps, out=None, smem_limit=0,
//               math="fp32") → (N, C_out):
//       mean over (D, H, W) of GroupNorm(hardswish(conv3d(x))), one fused kernel, the conv output never written.
//       smem_limit > 0 plans the shared memory as on a GPU with that opt-in limit per block (if below this
//       one's): the depth slabs an A100 (166912 B), an sm_86/89 (101376 B) or a T4 (65536 B) takes, testable here.
//       math: "fp32" (FFMA, the default) or "3xtf32" (tensor cores with the 3xTF32 split; sm_80+, C_out <= 16).
//   p27_tail(y, gn_weight, gn_bias, num_groups, eps, out=None) → (N, C): the same from a materialised conv
//       output y (N, C, D, H, W) — the "fuse only the tail" baseline.
//   config() → dict: the kernel's compile-time constants (filter size, channels and columns per thread, …).
//   plan(c_in, D, H, W, c_out, smem_limit, math="fp32") → dict: the shared-memory plan the launcher takes for one
//       sample under an opt-in limit of smem_limit bytes per block (slab depth, slabs, row pitch, bytes).
// float32, contiguous, CUDA; the biases and the GroupNorm affine parameters may be None (bias=False, affine=False).
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <climits>
#include <cstdint>
#include <optional>
#include <string>

#include "conv3d_gn_mean.h"
#include "torch_checks.h"

namespace {

void check_groups(int64_t C, int64_t num_groups, double eps, const char* op) {
    KB_CHECK(num_groups >= 1, op, ": num_groups must be at least 1, got ", num_groups);
    KB_CHECK(C % num_groups == 0, op, ": the channel count ", C, " must be a multiple of num_groups = ", num_groups);
    KB_CHECK(eps >= 0.0, op, ": eps must be non-negative, got ", eps);
}

torch::Tensor checked_out(const torch::Tensor& x, int64_t N, int64_t C, const std::optional<torch::Tensor>& out,
                          const char* op) {
    if (!out) return torch::empty({N, C}, x.options());
    kb::check_tensor(*out, op, "out");
    kb::check_shape(*out, {N, C}, op, "out");
    kb::check_same_device(x, *out, op, "x", "out");
    kb::check_no_overlap(x, *out, op, "x", "out");
    return *out;
}

const float* ptr(const std::optional<torch::Tensor>& t) { return t ? t->data_ptr<float>() : nullptr; }

int parse_math(const char* op, const std::string& math) {
    KB_CHECK(math == "fp32" || math == "3xtf32", op, ": math must be 'fp32' or '3xtf32', got '", math, "'");
    return math == "fp32" ? kP27Fp32 : kP27Tf32;
}

// The fused kernel's arithmetic for x (N, C_in, D, H, W) and c_out channels on x's GPU under max_smem:
// "fp32" → FFMA; "3xtf32" → the tensor cores, refused with the reason where they cannot run it (below sm_80,
// more than 16 output channels, not even one output depth in shared memory).
int resolve_math(const char* op, const std::string& math, const torch::Tensor& x, int64_t c_out, int max_smem) {
    const int m = parse_math(op, math);
    if (m == kP27Fp32) return m;
    int major = 0, minor = 0;
    const int dev = x.device().index();
    kb::check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), op, "reading the GPU");
    kb::check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev), op, "reading the GPU");
    const bool gpu_ok = major >= 8, channels_ok = c_out <= p27_max_out_channels(kP27Tf32);
    const bool fits = channels_ok && p27_slab_depth(static_cast<int>(x.size(1)), static_cast<int>(x.size(2)),
                                                    static_cast<int>(x.size(3)), static_cast<int>(x.size(4)),
                                                    static_cast<int>(c_out), max_smem, kP27Tf32) > 0;
    KB_CHECK(gpu_ok, op, ": math='3xtf32' needs tensor cores with TF32 (sm_80 or newer); this GPU is sm_",
             major * 10 + minor, " (use math='fp32')");
    KB_CHECK(channels_ok, op, ": math='3xtf32' supports at most ", p27_max_out_channels(kP27Tf32),
             " output channels (one tensor-core tile), got ", c_out, " (use math='fp32')");
    KB_CHECK(fits, op, ": math='3xtf32' needs ",
             p27_smem_bytes(static_cast<int>(x.size(1)), static_cast<int>(x.size(3)),
                            static_cast<int>((x.size(4) + 3) / 4 * 4), static_cast<int>(c_out), 1, kP27Tf32),
             " bytes of shared memory for one output depth of this input, more than the ", max_smem,
             " per block here (use math='fp32')");
    return m;
}

// The opt-in shared memory per block of x's GPU, or smem_limit where that is lower (and not 0).
int smem_budget(const char* op, const torch::Tensor& x, int64_t smem_limit) {
    int max_smem = 0;
    kb::check_cuda(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, x.device().index()),
                   op, "reading the device's opt-in shared memory per block");
    if (smem_limit > 0 && smem_limit < max_smem) max_smem = static_cast<int>(smem_limit);
    return max_smem;
}

}  // namespace

torch::Tensor p27_forward(const torch::Tensor& x, const torch::Tensor& conv_weight,
                          const std::optional<torch::Tensor>& conv_bias, const std::optional<torch::Tensor>& gn_weight,
                          const std::optional<torch::Tensor>& gn_bias, int64_t num_groups, double eps,
                          const std::optional<torch::Tensor>& out, int64_t smem_limit, const std::string& math) {
    constexpr const char* op = "p27_forward";
    kb::check_dim(x, 5, "(N, C_in, D, H, W)", op, "x");
    kb::check_dim(conv_weight, 5, "(C_out, C_in, K, K, K)", op, "conv_weight");
    kb::check_tensor(x, op, "x");
    kb::check_tensor(conv_weight, op, "conv_weight");
    kb::check_same_device(x, conv_weight, op, "x", "conv_weight");
    const int64_t N = x.size(0), c_in = x.size(1), D = x.size(2), H = x.size(3), W = x.size(4);
    const int64_t c_out = conv_weight.size(0);
    const int k = p27_kernel_size();
    kb::check_conv_weight(x, conv_weight, k, op, "conv_weight", "fused kernel");
    KB_CHECK(c_out >= 1 && c_out <= p27_max_out_channels(kP27Fp32), op, ": out_channels must be between 1 and ",
             p27_max_out_channels(kP27Fp32), " (8 per thread, 16 warps), got ", c_out);
    KB_CHECK(c_in >= 1, op, ": x must have at least one input channel, got shape ", kb::shape_str(x.sizes()));
    KB_CHECK(D >= k && H >= k && W >= k, op, ": the input volume ", D, "x", H, "x", W, " is smaller than the ", k,
             "x", k, "x", k, " filter (no padding: the output would be empty)");
    KB_CHECK(N <= INT_MAX && c_in <= 4096 && D <= INT_MAX && H <= 65536 && W <= 65536, op,
             ": sizes out of range (N < 2^31, C_in <= 4096, H and W <= 65536), got x ", kb::shape_str(x.sizes()));
    kb::check_channel_vector(conv_bias, x, c_out, op, "conv_bias", "one value per output channel");
    kb::check_channel_vector(gn_weight, x, c_out, op, "gn_weight", "one value per output channel");
    kb::check_channel_vector(gn_bias, x, c_out, op, "gn_bias", "one value per output channel");
    check_groups(c_out, num_groups, eps, op);
    KB_CHECK(smem_limit >= 0, op, ": smem_limit must be 0 (the device's limit) or a byte count, got ", smem_limit);
    parse_math(op, math);
    torch::Tensor y = checked_out(x, N, c_out, out, op);

    const c10::cuda::CUDAGuard guard(x.device());
    const int max_smem = smem_budget(op, x, smem_limit);
    const int m = resolve_math(op, math, x, c_out, max_smem);
    if (N == 0) return y;
    const int T = p27_slab_depth(static_cast<int>(c_in), static_cast<int>(D), static_cast<int>(H),
                                 static_cast<int>(W), static_cast<int>(c_out), max_smem, m);
    KB_CHECK(T > 0, op, ": one output depth of this input (", c_in, " channels x 4 planes of ", H, "x", W,
             ", plus the weights) needs ",
             p27_smem_bytes(static_cast<int>(c_in), static_cast<int>(H), static_cast<int>((W + 3) / 4 * 4),
                            static_cast<int>(c_out), 1, m),
             " bytes of shared memory, more than the ", max_smem, " this GPU allows per block",
             smem_limit > 0 ? " (or smem_limit)" : "");
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
    kb::check_launch(launch_p27_fused(x.data_ptr<float>(), conv_weight.data_ptr<float>(), ptr(conv_bias),
                                      ptr(gn_weight), ptr(gn_bias), y.data_ptr<float>(), N, static_cast<int>(c_in),
                                      static_cast<int>(D), static_cast<int>(H), static_cast<int>(W),
                                      static_cast<int>(c_out), static_cast<int>(num_groups), static_cast<float>(eps),
                                      max_smem, m, stream),
                     op);
    return y;
}

torch::Tensor p27_tail(const torch::Tensor& y, const std::optional<torch::Tensor>& gn_weight,
                       const std::optional<torch::Tensor>& gn_bias, int64_t num_groups, double eps,
                       const std::optional<torch::Tensor>& out) {
    constexpr const char* op = "p27_tail";
    KB_CHECK(y.dim() >= 3, op, ": y must be (N, C, D, H, W) or (N, C, S), got shape ", kb::shape_str(y.sizes()));
    kb::check_tensor(y, op, "y");
    const int64_t N = y.size(0), C = y.size(1);
    int64_t S = 1;
    for (int64_t d = 2; d < y.dim(); ++d) S *= y.size(d);
    KB_CHECK(C >= 1 && C <= p27_tail_max_channels(), op, ": the channel count must be between 1 and ",
             p27_tail_max_channels(), ", got ", C);
    KB_CHECK(S >= 1, op, ": each channel needs at least one value, got y of shape ", kb::shape_str(y.sizes()));
    KB_CHECK(N <= INT_MAX, op, ": at most 2^31 - 1 samples, got ", N);
    kb::check_channel_vector(gn_weight, y, C, op, "gn_weight", "one value per channel");
    kb::check_channel_vector(gn_bias, y, C, op, "gn_bias", "one value per channel");
    check_groups(C, num_groups, eps, op);
    torch::Tensor o = checked_out(y, N, C, out, op);
    if (N == 0) return o;
    const c10::cuda::CUDAGuard guard(y.device());
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(y.device().index()).stream();
    kb::check_launch(launch_p27_tail(y.data_ptr<float>(), ptr(gn_weight), ptr(gn_bias), o.data_ptr<float>(), N,
                                     static_cast<int>(C), S, static_cast<int>(num_groups), static_cast<float>(eps),
                                     stream),
                     op);
    return o;
}

pybind11::dict p27_config() {
    int v[16] = {};
    const int n = p27_constants(v, 16);
    const char* names[] = {"kernel_size", "channels_per_thread", "columns_per_thread", "window_columns",
                           "threads", "tail_threads", "kd_unroll", "stage_loads"};
    KB_CHECK(n == static_cast<int>(sizeof(names) / sizeof(names[0])), "config: constants and names disagree");
    pybind11::dict d;
    for (int i = 0; i < n; ++i) d[names[i]] = v[i];
    return d;
}

pybind11::dict p27_plan(int64_t c_in, int64_t D, int64_t H, int64_t W, int64_t c_out, int64_t smem_limit,
                        const std::string& math) {
    constexpr const char* op = "plan";
    const int k = p27_kernel_size();
    const int m = parse_math(op, math);
    KB_CHECK(c_in >= 1 && c_out >= 1 && c_out <= p27_max_out_channels(m) && D >= k && H >= k && W >= k &&
                 D <= 65536 && H <= 65536 && W <= 65536 && c_in <= 4096 && smem_limit > 0,
             op, ": sizes out of range (c_in ", c_in, ", D x H x W ", D, "x", H, "x", W, ", c_out ", c_out,
             ", smem_limit ", smem_limit, ")");
    const int ci = static_cast<int>(c_in), d = static_cast<int>(D), h = static_cast<int>(H), w = static_cast<int>(W),
              co = static_cast<int>(c_out);
    const int T = p27_slab_depth(ci, d, h, w, co, smem_limit, m);
    const int DO = d - k + 1;
    pybind11::dict r;
    r["depths_per_slab"] = T;
    r["slabs"] = T > 0 ? (DO + T - 1) / T : 0;
    const int Wp = T > 0 ? p27_pitch(ci, h, w, co, T, smem_limit, m) : (w + 3) / 4 * 4;
    r["row_pitch"] = Wp;
    r["smem_bytes"] = T > 0 ? p27_smem_bytes(ci, h, Wp, co, T, m) : int64_t{0};
    return r;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    using pybind11::arg;
    m.def("p27_forward", &p27_forward,
          "mean over (D, H, W) of GroupNorm(hardswish(conv3d(x))): one fused kernel, 4x4x4 filters, stride 1, "
          "no padding, float32-accurate (FFMA, or the tensor cores with the 3xTF32 split); returns (N, C_out)",
          arg("x"), arg("conv_weight"), arg("conv_bias"), arg("gn_weight"), arg("gn_bias"), arg("num_groups"),
          arg("eps"), arg("out") = pybind11::none(), arg("smem_limit") = 0, arg("math") = "fp32");
    m.def("p27_tail", &p27_tail,
          "mean over the spatial dims of GroupNorm(hardswish(y)) from a materialised conv output y; returns (N, C)",
          arg("y"), arg("gn_weight"), arg("gn_bias"), arg("num_groups"), arg("eps"), arg("out") = pybind11::none());
    m.def("config", &p27_config, "the fused kernel's compile-time constants");
    m.def("plan", &p27_plan, "the shared-memory plan of one sample under an opt-in limit (bytes per block)",
          arg("c_in"), arg("D"), arg("H"), arg("W"), arg("c_out"), arg("smem_limit"), arg("math") = "fp32");
}
