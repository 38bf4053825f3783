// dev/p27w/ext.cu — a torch binding for dev/p27w/conv3d_wgmma.cuh (built for sm_90a by dev/p27w/run.py).
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

#include "conv3d_wgmma.cuh"

// sums: None → returns y = conv3d(x, w) + b; else fills sums (float64 [N, C_out, 2], zeroed here) with
// Σ 6·hardswish(y), Σ (6·hardswish(y))² per (sample, channel) and returns it.
torch::Tensor conv3d_wgmma(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b, bool sums,
                           int64_t blocks) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32 && x.is_contiguous() && x.dim() == 5, "x");
    TORCH_CHECK(w.is_contiguous() && w.dim() == 5 && w.size(1) == x.size(1) && w.size(2) == 4, "w: 4×4×4");
    TORCH_CHECK(b.is_contiguous() && b.numel() == w.size(0), "b");
    const auto s = p27w::make_shape(x.size(0), x.size(1), x.size(2), x.size(3), x.size(4), w.size(0));
    torch::Tensor out = sums ? torch::zeros({x.size(0), w.size(0), 2}, x.options().dtype(torch::kFloat64))
                             : torch::empty({x.size(0), w.size(0), s.DO, s.HO, s.WO}, x.options());
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
    const cudaError_t err = p27w::conv(x.data_ptr<float>(), w.data_ptr<float>(), b.data_ptr<float>(),
                                       sums ? nullptr : out.data_ptr<float>(), sums ? out.data_ptr<double>() : nullptr,
                                       s, static_cast<int>(blocks), stream);
    TORCH_CHECK(err == cudaSuccess, "conv3d_wgmma: ", cudaGetErrorString(err));
    return out;
}

// P27 whole: the sums mode, then finish_kernel (two launches; the 716 MB intermediate is never written).
torch::Tensor p27_forward(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                          const torch::Tensor& gw, const torch::Tensor& gb, int64_t groups, double eps) {
    TORCH_CHECK(w.size(0) % groups == 0 && gw.numel() == w.size(0) && gb.numel() == w.size(0), "groups");
    const torch::Tensor sums = conv3d_wgmma(x, w, b, true, 396);
    torch::Tensor out = torch::empty({x.size(0), w.size(0)}, x.options());
    const auto s = p27w::make_shape(x.size(0), x.size(1), x.size(2), x.size(3), x.size(4), w.size(0));
    const int items = static_cast<int>(x.size(0) * groups);
    p27w::finish_kernel<<<(items + 127) / 128, 128, 0, c10::cuda::getCurrentCUDAStream().stream()>>>(
        sums.data_ptr<double>(), gw.data_ptr<float>(), gb.data_ptr<float>(), out.data_ptr<float>(),
        static_cast<int>(x.size(0)), static_cast<int>(w.size(0)), static_cast<int>(groups),
        static_cast<double>(s.DO) * s.HO * s.WO, static_cast<float>(eps));
    const cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "finish_kernel: ", cudaGetErrorString(err));
    return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("conv3d_wgmma", &conv3d_wgmma, pybind11::arg("x"), pybind11::arg("w"), pybind11::arg("b"),
          pybind11::arg("sums") = false, pybind11::arg("blocks") = 396);
    m.def("p27_forward", &p27_forward);
}
