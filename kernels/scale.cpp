// scale.cpp — the torch binding of scale.cu: validate, allocate, launch on PyTorch's stream.
//
// Checks run in the order dtype → layout → device, so that each message names the first thing
// wrong with the argument (and so that every message can be exercised on a machine without a GPU).
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <cstdint>

// From scale.cu.
cudaError_t launch_scale(const float* x, float* y, float s, int64_t n, cudaStream_t stream);

namespace {

void check_float32_cuda_contiguous(const torch::Tensor& t, const char* name) {
    TORCH_CHECK(t.scalar_type() == torch::kFloat32, "scale: ", name, " must be float32, got ",
                t.scalar_type());
    TORCH_CHECK(t.is_contiguous(), "scale: ", name, " must be contiguous, got strides ", t.strides(),
                " for sizes ", t.sizes(), " (call .contiguous() first)");
    TORCH_CHECK(t.is_cuda(), "scale: ", name, " must be a CUDA tensor, got a tensor on ", t.device());
}

}  // namespace

// out = s * x, written into a caller-provided tensor (the checker passes a NaN-poisoned one).
torch::Tensor scale_out(const torch::Tensor& x, double s, torch::Tensor out) {
    check_float32_cuda_contiguous(x, "x");
    check_float32_cuda_contiguous(out, "out");
    TORCH_CHECK(out.sizes() == x.sizes(), "scale: out must have the shape of x ", x.sizes(), ", got ",
                out.sizes());
    TORCH_CHECK(out.device() == x.device(), "scale: out is on ", out.device(), " but x is on ", x.device());
    const auto* xb = static_cast<const char*>(x.data_ptr());
    const auto* ob = static_cast<const char*>(out.data_ptr());
    const int64_t nbytes = x.numel() * static_cast<int64_t>(sizeof(float));
    TORCH_CHECK(x.numel() == 0 || ob + nbytes <= xb || xb + nbytes <= ob,
                "scale: out must not overlap x (the kernel's pointers are __restrict__)");

    const c10::cuda::CUDAGuard guard(x.device());
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
    const cudaError_t err =
        launch_scale(x.data_ptr<float>(), out.data_ptr<float>(), static_cast<float>(s), x.numel(), stream);
    TORCH_CHECK(err == cudaSuccess, "scale: kernel launch failed: ", cudaGetErrorString(err));
    return out;
}

torch::Tensor scale(const torch::Tensor& x, double s) {
    check_float32_cuda_contiguous(x, "x");
    return scale_out(x, s, torch::empty_like(x));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("scale", &scale, "y = s * x for a contiguous float32 CUDA tensor x", pybind11::arg("x"),
          pybind11::arg("s"));
    m.def("scale_out", &scale_out, "out = s * x, into a preallocated tensor of x's shape", pybind11::arg("x"),
          pybind11::arg("s"), pybind11::arg("out"));
}
