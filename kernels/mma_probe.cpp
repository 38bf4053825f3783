// mma_probe.cpp — the torch binding of mma_probe.cu.
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <climits>

#include "mma_probe.h"
#include "sm_checks.h"
#include "torch_checks.h"

// D = A·B + C by one mma.sync.m16n8k8 TF32: A 16×8, B 8×8, C 16×8; round=False passes the float32 bits
// unchanged, round=True rounds the operands to TF32 (cvt.rna) first.
torch::Tensor mma_probe(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c, bool round) {
    constexpr const char* op = "mma_probe";
    kb::check_tensor(a, op, "a");
    kb::check_tensor(b, op, "b");
    kb::check_tensor(c, op, "c");
    kb::check_shape(a, {16, 8}, op, "a");
    kb::check_shape(b, {8, 8}, op, "b");
    kb::check_shape(c, {16, 8}, op, "c");
    kb::check_same_device(a, b, op, "a", "b");
    kb::check_same_device(a, c, op, "a", "c");
    const c10::cuda::CUDAGuard guard(a.device());
    kb::require_tf32_tensor_cores(a, op);
    auto d = torch::empty({16, 8}, a.options());
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(a.device().index()).stream();
    kb::check_launch(launch_mma_probe(a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(),
                                      d.data_ptr<float>(), round ? 1 : 0, stream),
                     op);
    return d;
}

// Time this: `blocks` blocks issuing `iters` rounds of independent TF32 products with varying operands from
// `seeds` (int32, 6 per thread of a block). Returns (out, clocks): clocks[block] = (SM cycles, ns) of its loop.
std::vector<torch::Tensor> mma_ceiling(const torch::Tensor& seeds, int64_t blocks, int64_t iters) {
    constexpr const char* op = "mma_ceiling";
    kb::check_tensor(seeds, op, "seeds", torch::kInt32);
    kb::check_shape(seeds, {6 * kMmaCeilingThreads}, op, "seeds");
    KB_CHECK(blocks > 0 && blocks <= INT_MAX && iters >= 0 && iters <= INT_MAX, op, ": blocks must be in [1, 2^31)",
             " and iters in [0, 2^31), got ", blocks, " and ", iters);
    const c10::cuda::CUDAGuard guard(seeds.device());
    kb::require_tf32_tensor_cores(seeds, op);
    auto out = torch::empty({blocks * kMmaCeilingThreads}, seeds.options().dtype(torch::kFloat32));
    auto clocks = torch::empty({blocks, 2}, seeds.options().dtype(torch::kInt64));
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(seeds.device().index()).stream();
    kb::check_launch(launch_mma_ceiling(reinterpret_cast<const unsigned*>(seeds.data_ptr<int32_t>()),
                                        out.data_ptr<float>(), reinterpret_cast<long long*>(clocks.data_ptr<int64_t>()),
                                        static_cast<int>(blocks), static_cast<int>(iters), stream),
                     op);
    return {out, clocks};
}

pybind11::dict ceiling_config() {
    pybind11::dict d;
    d["threads"] = kMmaCeilingThreads, d["chains"] = kMmaCeilingChains, d["macs_per_mma"] = 16 * 8 * 8;
    return d;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("mma_probe", &mma_probe, "D = A @ B + C by one TF32 mma.sync.m16n8k8 (A 16x8, B 8x8, C 16x8)",
          pybind11::arg("a"), pybind11::arg("b"), pybind11::arg("c"), pybind11::arg("round") = false);
    m.def("mma_ceiling", &mma_ceiling, "time this: the TF32 mma.sync rate with varying operands; returns (out, clocks)",
          pybind11::arg("seeds"), pybind11::arg("blocks"), pybind11::arg("iters"));
    m.def("ceiling_config", &ceiling_config, "the mma_ceiling kernel: threads per block, chains per warp, MACs per mma");
}
