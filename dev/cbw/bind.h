// dev/cbw/bind.h — the torch binding of one variant's cbwx-style conv (dev/cbw/variants.py generates the module
// that includes dev/cbw/conv_wgmma_x.cuh once per variant, then binds each namespace's conv through conv_with).
#pragma once
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

using ConvFn = cudaError_t (*)(const float*, const float*, const float*, float*, int64_t, int, int, int, int,
                               const unsigned*, unsigned, cudaStream_t, double*);

template <ConvFn F>
torch::Tensor conv_with(const torch::Tensor& x, const torch::Tensor& w, const std::optional<torch::Tensor>& b,
                        const std::optional<torch::Tensor>& out, const std::optional<torch::Tensor>& stats) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32 && x.is_contiguous() && x.dim() == 4, "x");
    TORCH_CHECK(!stats || (stats->is_cuda() && stats->scalar_type() == torch::kFloat64 && stats->is_contiguous() &&
                           stats->numel() == 2 * x.size(1) + w.size(0)), "stats: float64, 2·C_in + C_out, zeroed");
    TORCH_CHECK(w.is_contiguous() && w.size(2) == 3 && w.size(3) == 3 && w.size(1) == x.size(1), "w");
    const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3), K = w.size(0);
    torch::Tensor y = out ? *out : torch::empty({N, K, H - 2, W - 2}, x.options());
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
    const cudaError_t err = F(x.data_ptr<float>(), w.data_ptr<float>(), b ? b->data_ptr<float>() : nullptr,
                              y.data_ptr<float>(), N, static_cast<int>(C), static_cast<int>(H), static_cast<int>(W),
                              static_cast<int>(K), nullptr, 0u, stream, stats ? stats->data_ptr<double>() : nullptr);
    TORCH_CHECK(err == cudaSuccess, "conv_wgmma: ", cudaGetErrorString(err));
    return y;
}
