// gemm_wgmma.cpp — the torch binding of gemm_wgmma.cu: validate, allocate, launch on PyTorch's stream.
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <climits>
#include <cstdint>
#include <vector>

#include "gemm_wgmma.h"
#include "sm_checks.h"

namespace {

// The wgmma kernels run on sm_90 alone (H100, H200), from a binary built for sm_90a.
bool runs_here(const torch::Tensor& t, const char* op) {
    bool built = false;
    kb::check_cuda(gemm_wgmma_built(&built), op, "asking the loaded kernels which GPU they were built for");
    return built && kb::compute_capability(t, op) == 90;
}

void require_wgmma(const torch::Tensor& t, const char* op) {
    const int cc = kb::compute_capability(t, op);
    KB_CHECK(cc == 90, op, ": wgmma is Hopper's instruction (sm_90: H100, H200); this GPU is sm_", cc,
             " (use gemm_3xtf32's mma.sync path)");
    KB_CHECK(runs_here(t, op), op, ": this build has no sm_90a kernels (wgmma needs -gencode=arch=compute_90a,"
             "code=sm_90a; kernelbook.build.load does this on an sm_90 GPU)");
}

}  // namespace

// C = A·B through wgmma; passes=3 is the float32-accurate 3xTF32 split, passes=1 plain TF32.
torch::Tensor gemm(const torch::Tensor& a, const torch::Tensor& b, int64_t passes, int64_t version) {
    constexpr const char* op = "gemm_wgmma";
    kb::check_tensor(a, op, "a");
    kb::check_tensor(b, op, "b");
    kb::check_same_device(a, b, op, "a", "b");
    KB_CHECK(a.dim() == 2 && b.dim() == 2, op, ": a and b must be matrices (2 dimensions), got ", a.dim(), " and ",
             b.dim());
    KB_CHECK(passes == 1 || passes == 3, op, ": passes must be 3 (3xTF32) or 1 (TF32), got ", passes);
    KB_CHECK(version == 1 || version == 2, op, ": version must be 1 (chained) or 2 (staged), got ", version);
    const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
    KB_CHECK(b.size(0) == K, op, ": a is ", M, "x", K, " but b is ", b.size(0), "x", N, ": inner sizes differ");
    KB_CHECK(M > 0 && N > 0 && K > 0, op, ": every size must be at least 1, got M=", M, " N=", N, " K=", K);
    const auto cfg = gemm_wgmma_config(static_cast<int>(passes));
    KB_CHECK((M + cfg.bm - 1) / cfg.bm <= 65535, op, ": M=", M, " is over the grid's ", 65535 * cfg.bm, " rows");
    KB_CHECK(N <= INT_MAX - cfg.bn && K <= INT_MAX - 4, op, ": N and K must be under 2^31, got N=", N, " K=", K);
    const c10::cuda::CUDAGuard guard(a.device());
    require_wgmma(a, op);
    auto c = torch::empty({M, N}, a.options());
    auto work = torch::empty({static_cast<int64_t>(gemm_wgmma_workspace_bytes(static_cast<int>(M),
                                                                                static_cast<int>(N),
                                                                                static_cast<int>(K)))},
                             a.options().dtype(torch::kUInt8));
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(a.device().index()).stream();
    kb::check_launch(launch_gemm_wgmma(a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(),
                                       static_cast<int>(M), static_cast<int>(N), static_cast<int>(K),
                                       static_cast<int>(passes), static_cast<int>(version), work.data_ptr(), stream),
                     op);
    return c;
}

// Whether this GPU and this build run the wgmma kernels (the chapters choose their path by it).
bool available(const torch::Device& device) {
    if (!device.is_cuda()) return false;
    const c10::cuda::CUDAGuard guard(device);
    auto probe = torch::empty({1}, torch::TensorOptions().device(device));
    return runs_here(probe, "gemm_wgmma.available");
}

pybind11::dict config(int64_t passes) {
    KB_CHECK(passes == 1 || passes == 3, "gemm_wgmma: passes must be 3 (3xTF32) or 1 (TF32), got ", passes);
    const auto t = gemm_wgmma_config(static_cast<int>(passes));
    pybind11::dict d;
    d["bm"] = t.bm, d["bn"] = t.bn, d["bk"] = t.bk, d["stages"] = t.stages, d["threads"] = t.threads;
    d["smem_bytes"] = t.smem_bytes;
    return d;
}

// The wgmma TF32 ceiling: `blocks` blocks issuing `iters` rounds of products from shared memory (see the .h).
std::vector<torch::Tensor> wgmma_ceiling(const torch::Tensor& seeds, int64_t blocks, int64_t iters) {
    constexpr const char* op = "wgmma_ceiling";
    kb::check_tensor(seeds, op, "seeds", torch::kInt32);
    kb::check_shape(seeds, {kWgmmaCeilingThreads}, op, "seeds");
    KB_CHECK(blocks > 0 && blocks <= INT_MAX && iters >= 0 && iters <= INT_MAX, op, ": blocks must be in [1, 2^31)",
             " and iters in [0, 2^31), got ", blocks, " and ", iters);
    const c10::cuda::CUDAGuard guard(seeds.device());
    require_wgmma(seeds, op);
    auto out = torch::empty({blocks * kWgmmaCeilingThreads}, seeds.options().dtype(torch::kFloat32));
    auto clocks = torch::empty({blocks, 2}, seeds.options().dtype(torch::kInt64));
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(seeds.device().index()).stream();
    kb::check_launch(launch_wgmma_ceiling(reinterpret_cast<const unsigned*>(seeds.data_ptr<int32_t>()),
                                          out.data_ptr<float>(), reinterpret_cast<long long*>(clocks.data_ptr<int64_t>()),
                                          static_cast<int>(blocks), static_cast<int>(iters), stream),
                     op);
    return {out, clocks};
}

pybind11::dict ceiling_config() {
    pybind11::dict d;
    // per warpgroup and round: 4 products of 64×256×8 multiply-adds
    d["threads"] = kWgmmaCeilingThreads, d["warpgroups"] = kWgmmaCeilingThreads / 128;
    d["products_per_round"] = 4, d["macs_per_product"] = 64 * kWgmmaCeilingN * 8;
    return d;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("gemm", &gemm, "C = A @ B through wgmma and the copy engine: passes=3 is 3xTF32, 1 is TF32",
          pybind11::arg("a"), pybind11::arg("b"), pybind11::arg("passes") = 3, pybind11::arg("version") = 2);
    m.def("available", &available, "whether this GPU and build run the wgmma kernels (sm_90, sm_90a build)",
          pybind11::arg("device"));
    m.def("config", &config, "the tiling: bm, bn, bk, stages, threads, smem_bytes", pybind11::arg("passes") = 3);
    m.def("wgmma_ceiling", &wgmma_ceiling, "time this: the wgmma TF32 rate from shared memory; returns (out, clocks)",
          pybind11::arg("seeds"), pybind11::arg("blocks"), pybind11::arg("iters"));
    m.def("ceiling_config", &ceiling_config, "the wgmma_ceiling kernel: threads, warpgroups, products, MACs");
}
