// gemm_3xtf32.cpp — the torch binding of gemm_3xtf32.cu: validate, allocate, launch on PyTorch's stream.
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <climits>
#include <cstdint>

#include "gemm_3xtf32.h"
#include "torch_checks.h"

namespace {

void check_matrix(const torch::Tensor& t, const char* name) {
    kb::check_tensor(t, "gemm_tf32", name);
    KB_CHECK(t.dim() == 2, "gemm_tf32: ", name, " must be a matrix (2 dimensions), got ", t.dim());
    KB_CHECK(t.size(0) <= INT_MAX && t.size(1) <= INT_MAX, "gemm_tf32: ", name, " is too large for 32-bit indices");
    KB_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, "gemm_tf32: ", name,
             " must start on a 16-byte boundary (tiles are copied 16 bytes at a time)");
}

}  // namespace

namespace {

void require_tf32_tensor_cores(const torch::Tensor& t, const char* fn) {
    int major = 0, minor = 0;
    kb::check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, t.device().index()), fn,
                   "reading the GPU's compute capability");
    kb::check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, t.device().index()), fn,
                   "reading the GPU's compute capability");
    KB_CHECK(major >= 8, fn, ": needs tensor cores with TF32 (sm_80 or newer); this GPU is sm_", major * 10 + minor);
}

}  // namespace

// C = A·B on tensor cores; passes=3 is the float32-accurate 3xTF32 split, passes=1 plain TF32.
torch::Tensor gemm_tf32(const torch::Tensor& a, const torch::Tensor& b, int64_t passes, int64_t version) {
    check_matrix(a, "a");
    check_matrix(b, "b");
    kb::check_same_device(a, b, "gemm_tf32", "a", "b");
    KB_CHECK(passes == 1 || passes == 3, "gemm_tf32: passes must be 3 (3xTF32) or 1 (TF32), got ", passes);
    KB_CHECK(version >= 1 && version <= 5, "gemm_tf32: version must be 1 to 5, got ", version);
    const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
    KB_CHECK(b.size(0) == K, "gemm_tf32: a is ", M, "x", K, " but b is ", b.size(0), "x", N, ": inner sizes differ");
    KB_CHECK(K % 4 == 0 && N % 4 == 0, "gemm_tf32: K and N must be multiples of 4 (rows are copied as float4s), got K=",
             K, " N=", N);
    KB_CHECK(M <= INT_MAX - 128, "gemm_tf32: a has too many rows for 32-bit row indices: ", M);
    const auto tiling = gemm_tf32_config(static_cast<int>(version));
    KB_CHECK((version >= 3 ? (N + tiling.bn - 1) / tiling.bn : (M + tiling.bm - 1) / tiling.bm) <= 65535,
             "gemm_tf32: ", version >= 3 ? "N" : "M", " is too large for version ", version, "'s grid");
    const c10::cuda::CUDAGuard guard(a.device());
    require_tf32_tensor_cores(a, "gemm_tf32");
    auto c = torch::empty({M, N}, a.options());
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(a.device().index()).stream();
    kb::check_launch(launch_gemm_tf32(a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(),
                                      static_cast<int>(M), static_cast<int>(N), static_cast<int>(K),
                                      static_cast<int>(passes), static_cast<int>(version), stream),
                     "gemm_tf32");
    return c;
}

pybind11::dict config(int64_t version) {
    KB_CHECK(version >= 1 && version <= 5, "gemm_tf32: version must be 1 to 5, got ", version);
    const auto t = gemm_tf32_config(static_cast<int>(version));
    pybind11::dict d;
    d["bm"] = t.bm, d["bn"] = t.bn, d["bk"] = t.bk, d["wm"] = t.wm, d["wn"] = t.wn;
    d["threads"] = t.threads, d["stages"] = t.stages, d["smem_bytes"] = t.smem_bytes;
    return d;
}

// The mma.sync TF32 ceiling: `blocks` blocks issuing `iters` rounds of independent products (see the .h).
torch::Tensor mma_peak(int64_t blocks, int64_t iters, const torch::Device& device) {
    KB_CHECK(device.is_cuda(), "mma_peak: needs a CUDA device, got ", device.str());
    KB_CHECK(blocks > 0 && blocks <= INT_MAX && iters >= 0 && iters <= INT_MAX, "mma_peak: blocks must be in [1, 2^31)",
             " and iters in [0, 2^31), got ", blocks, " and ", iters);
    const c10::cuda::CUDAGuard guard(device);
    auto probe = torch::empty({1}, torch::TensorOptions().device(device));
    require_tf32_tensor_cores(probe, "mma_peak");
    auto out = torch::empty({blocks * mma_peak_config().threads}, probe.options());
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
    kb::check_launch(launch_mma_peak(out.data_ptr<float>(), static_cast<int>(blocks), static_cast<int>(iters), stream),
                     "mma_peak");
    return out;
}

pybind11::dict peak_config() {
    const auto p = mma_peak_config();
    pybind11::dict d;
    d["threads"] = p.threads, d["chains"] = p.chains, d["macs_per_mma"] = p.macs;
    return d;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("gemm_tf32", &gemm_tf32, "C = A @ B on tensor cores: passes=3 is 3xTF32 (float32-accurate), 1 is TF32",
          pybind11::arg("a"), pybind11::arg("b"), pybind11::arg("passes") = 3, pybind11::arg("version") = 5);
    m.def("config", &config, "a version's tiling: bm, bn, bk, wm, wn, threads, stages, smem_bytes",
          pybind11::arg("version") = 5);
    m.def("mma_peak", &mma_peak, "time this: the mma.sync TF32 rate with nothing else in the loop",
          pybind11::arg("blocks"), pybind11::arg("iters"), pybind11::arg("device"));
    m.def("peak_config", &peak_config, "the mma_peak kernel: threads per block, chains per warp, MACs per mma");
}
