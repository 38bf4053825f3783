// dev/mw/ext.cu — a torch binding for dev/mw/moments_wgmma.cuh (built for sm_90a by dev/mw/run.py).
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

#include "moments_wgmma.cuh"

// The lag sums and first moments of x (N, C ≤ 8, H, W), float32 contiguous CUDA: a float64 tensor laid out as
// conv_moments.cuh's acc (combo · SLOTS; only slot 0 written).
torch::Tensor mw_sums(const torch::Tensor& x, int64_t blocks) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32 && x.is_contiguous() && x.dim() == 4, "x");
    torch::Tensor acc = torch::zeros({cbm::ACC_DOUBLES}, x.options().dtype(torch::kFloat64));
    const cudaError_t err = mw::sums(x.data_ptr<float>(), acc.data_ptr<double>(), x.size(0),
                                     static_cast<int>(x.size(1)), static_cast<int>(x.size(2)),
                                     static_cast<int>(x.size(3)), static_cast<int>(blocks),
                                     c10::cuda::getCurrentCUDAStream().stream());
    TORCH_CHECK(err == cudaSuccess, "mw_sums: ", cudaGetErrorString(err));
    return acc;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("mw_sums", &mw_sums, pybind11::arg("x"), pybind11::arg("blocks") = 132);
}
