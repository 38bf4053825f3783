// scale.cpp — the torch binding of scale.cu: validate, allocate, launch on PyTorch's stream.
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>

#include "scale.h"
#include "torch_checks.h"

// The kernel's tiling constants: threads per block, float4 loads per thread, bytes per vector access.
pybind11::dict config() {
    int threads = 0, unroll = 0, vec_bytes = 0;
    scale_config(&threads, &unroll, &vec_bytes);
    pybind11::dict d;
    d["threads"] = threads;
    d["unroll"] = unroll;
    d["vec_bytes"] = vec_bytes;
    return d;
}

// out = s * x, written into a caller-provided tensor (the checker passes a NaN-poisoned one).
torch::Tensor scale_out(const torch::Tensor& x, double s, torch::Tensor out) {
    kb::check_tensor(x, "scale", "x");
    kb::check_tensor(out, "scale", "out");
    kb::check_shape(out, x.sizes(), "scale", "out");
    kb::check_same_device(x, out, "scale", "x", "out");
    kb::check_no_overlap(x, out, "scale", "x", "out");

    const c10::cuda::CUDAGuard guard(x.device());
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
    kb::check_launch(
        launch_scale(x.data_ptr<float>(), out.data_ptr<float>(), static_cast<float>(s), x.numel(), stream), "scale");
    return out;
}

torch::Tensor scale(const torch::Tensor& x, double s) {
    kb::check_tensor(x, "scale", "x");
    return scale_out(x, s, torch::empty_like(x));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("scale", &scale, "y = s * x for a contiguous float32 CUDA tensor x", pybind11::arg("x"),
          pybind11::arg("s"));
    m.def("scale_out", &scale_out, "out = s * x, into a preallocated tensor of x's shape", pybind11::arg("x"),
          pybind11::arg("s"), pybind11::arg("out"));
    m.def("config", &config, "the kernel's tiling constants: threads, unroll, vec_bytes");
}
