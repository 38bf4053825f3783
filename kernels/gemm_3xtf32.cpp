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

// C = A·B on tensor cores; passes=3 is the float32-accurate 3xTF32 split, passes=1 plain TF32.
torch::Tensor gemm_tf32(const torch::Tensor& a, const torch::Tensor& b, int64_t passes) {
    check_matrix(a, "a");
    check_matrix(b, "b");
    kb::check_same_device(a, b, "gemm_tf32", "a", "b");
    KB_CHECK(passes == 1 || passes == 3, "gemm_tf32: passes must be 3 (3xTF32) or 1 (TF32), got ", passes);
    const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
    KB_CHECK(b.size(0) == K, "gemm_tf32: a is ", M, "x", K, " but b is ", b.size(0), "x", N, ": inner sizes differ");
    KB_CHECK(K % 4 == 0 && N % 4 == 0, "gemm_tf32: K and N must be multiples of 4 (rows are copied as float4s), got K=",
             K, " N=", N);
    const c10::cuda::CUDAGuard guard(a.device());
    int major = 0, minor = 0;
    kb::check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, a.device().index()),
                   "gemm_tf32", "reading the GPU's compute capability");
    kb::check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, a.device().index()),
                   "gemm_tf32", "reading the GPU's compute capability");
    KB_CHECK(major >= 8, "gemm_tf32: needs tensor cores with TF32 (sm_80 or newer); this GPU is sm_",
             major * 10 + minor);
    auto c = torch::empty({M, N}, a.options());
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(a.device().index()).stream();
    kb::check_launch(launch_gemm_tf32(a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(),
                                      static_cast<int>(M), static_cast<int>(N), static_cast<int>(K),
                                      static_cast<int>(passes), stream),
                     "gemm_tf32");
    return c;
}

pybind11::dict config() {
    int bm, bn, bk, wm, wn, threads, stages, smem;
    gemm_tf32_config(&bm, &bn, &bk, &wm, &wn, &threads, &stages, &smem);
    pybind11::dict d;
    d["bm"] = bm, d["bn"] = bn, d["bk"] = bk, d["wm"] = wm, d["wn"] = wn;
    d["threads"] = threads, d["stages"] = stages, d["smem_bytes"] = smem;
    return d;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("gemm_tf32", &gemm_tf32, "C = A @ B on tensor cores: passes=3 is 3xTF32 (float32-accurate), 1 is TF32",
          pybind11::arg("a"), pybind11::arg("b"), pybind11::arg("passes") = 3);
    m.def("config", &config, "the tiling: bm, bn, bk, wm, wn, threads, stages, smem_bytes");
}
