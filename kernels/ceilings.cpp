// ceilings.cpp — the torch binding of ceilings.cu: a streaming copy and an FFMA throughput kernel.
#include <torch/extension.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>

#include "ceilings.h"
#include "torch_checks.h"

namespace {

bool aligned16(const torch::Tensor& t) { return (reinterpret_cast<uintptr_t>(t.data_ptr()) & 15u) == 0; }

}  // namespace

// out = x, element for element, with 16-byte accesses. grid: "tiles" (one block per tile: the hardware's
// block scheduler balances the SMs) or "resident" (as many blocks as fit on the GPU at once, each with a
// fixed share); unroll: float4 loads per thread per tile, 1, 4 or 8; cache: "default" or "streaming"
// (evict-first hints). Keeps no state between calls and allocates nothing but `out` when it is not given:
// safe on any stream and inside a CUDA graph.
torch::Tensor copy_streaming(const torch::Tensor& x, const std::optional<torch::Tensor>& out, const std::string& grid,
                             int64_t unroll, const std::string& cache) {
    KB_CHECK(grid == "tiles" || grid == "resident", "copy: grid must be \"tiles\" or \"resident\", got \"", grid,
             "\"");
    KB_CHECK(unroll == 1 || unroll == 4 || unroll == 8,
             "copy: unroll must be 1, 4 or 8 (float4 loads per thread per tile), got ", unroll);
    KB_CHECK(cache == "default" || cache == "streaming", "copy: cache must be \"default\" or \"streaming\", got \"",
             cache, "\"");
    kb::check_tensor(x, "copy", "x");
    torch::Tensor y = out.has_value() ? *out : torch::empty_like(x);
    kb::check_tensor(y, "copy", "out");
    kb::check_shape(y, x.sizes(), "copy", "out");
    kb::check_same_device(x, y, "copy", "x", "out");
    kb::check_no_overlap(x, y, "copy", "x", "out");
    KB_CHECK(aligned16(x) && aligned16(y), "copy: x and out must start on a 16-byte boundary (the kernel uses "
             "float4 accesses); a view such as x[1:] does not");
    if (x.numel() == 0) return y;

    const c10::cuda::CUDAGuard guard(x.device());
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
    kb::check_launch(launch_copy(x.data_ptr<float>(), y.data_ptr<float>(), x.numel(), static_cast<int>(unroll),
                                 grid == "resident", cache == "streaming", stream),
                     "copy");
    return y;
}

// (out, clocks): out[t] = Σ_j a_j after `iters` FMA steps per chain (see ceilings.cu); clocks (blocks, 2)
// int64 = SM cycles and nanoseconds of each block's loop. blocks = 0: as many as are resident at once.
// Runs on the current CUDA device.
std::tuple<torch::Tensor, torch::Tensor> ffma_throughput(int64_t iters, double m, double c, int64_t blocks) {
    KB_CHECK(iters >= 0 && iters <= INT32_MAX, "ffma: iters must be in [0, 2^31), got ", iters);
    KB_CHECK(blocks >= 0 && blocks <= INT32_MAX, "ffma: blocks must be in [0, 2^31), got ", blocks);
    const c10::DeviceIndex device = c10::cuda::current_device();
    int grid = static_cast<int>(blocks);
    if (grid == 0) kb::check_cuda(ceilings_resident_blocks(true, &grid), "ffma", "occupancy query");
    const auto opts = torch::TensorOptions().device(torch::kCUDA, device);
    torch::Tensor out = torch::empty({int64_t{grid} * ffma_threads_per_block()}, opts.dtype(torch::kFloat32));
    torch::Tensor clocks = torch::empty({grid, 2}, opts.dtype(torch::kInt64));
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
    kb::check_launch(launch_ffma(out.data_ptr<float>(), reinterpret_cast<long long*>(clocks.data_ptr<int64_t>()),
                                 grid, static_cast<int>(iters), static_cast<float>(m), static_cast<float>(c), stream),
                     "ffma");
    return {out, clocks};
}

int64_t resident_blocks(const std::string& kernel) {
    KB_CHECK(kernel == "copy" || kernel == "ffma", "resident_blocks: kernel must be \"copy\" or \"ffma\", got \"",
             kernel, "\"");
    int blocks = 0;
    kb::check_cuda(ceilings_resident_blocks(kernel == "ffma", &blocks), "resident_blocks", "occupancy query");
    return blocks;
}

// What the CUDA runtime says about the current device: the numbers a datasheet peak is computed from.
std::map<std::string, int64_t> device_attributes() {
    int dev = 0;
    kb::check_cuda(cudaGetDevice(&dev), "device_attributes", "cudaGetDevice");
    auto attr = [dev](cudaDeviceAttr a, const char* what) {
        int v = 0;
        kb::check_cuda(cudaDeviceGetAttribute(&v, a, dev), "device_attributes", what);
        return int64_t{v};
    };
    return {{"sm_count", attr(cudaDevAttrMultiProcessorCount, "SM count")},
            {"clock_khz", attr(cudaDevAttrClockRate, "SM clock")},
            {"memory_clock_khz", attr(cudaDevAttrMemoryClockRate, "memory clock")},
            {"memory_bus_bits", attr(cudaDevAttrGlobalMemoryBusWidth, "memory bus width")},
            {"max_threads_per_sm", attr(cudaDevAttrMaxThreadsPerMultiProcessor, "threads per SM")},
            {"warp_size", attr(cudaDevAttrWarpSize, "warp size")}};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("copy", &copy_streaming, "out = x with 16-byte accesses: one block per tile, or a resident grid",
          pybind11::arg("x"), pybind11::arg("out") = pybind11::none(), pybind11::arg("grid") = "tiles",
          pybind11::arg("unroll") = 1, pybind11::arg("cache") = "default");
    m.def("ffma", &ffma_throughput, "FP32 FMA throughput kernel: (per-thread sums, per-block cycles and ns)",
          pybind11::arg("iters"), pybind11::arg("m") = 1.0, pybind11::arg("c") = 1.0, pybind11::arg("blocks") = 0);
    m.def("resident_blocks", &resident_blocks, "blocks of kernel 'copy' (unroll 1) or 'ffma' resident on the GPU at once",
          pybind11::arg("kernel"));
    m.def("device_attributes", &device_attributes, "SM count, clocks (kHz), memory bus width (bits), threads per SM");
    m.attr("FFMA_THREADS") = ffma_threads_per_block();
    m.attr("FFMA_CHAINS") = ffma_chains();
}
