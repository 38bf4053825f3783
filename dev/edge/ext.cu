// dev/edge/ext.cu — a torch binding for the book's border kernel and dev/edge/edge_multi.cuh's candidate.
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

#include "edge_multi.cuh"

namespace {
cbm::MShape shape_of(const torch::Tensor& x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32 && x.is_contiguous() && x.dim() == 4 &&
                    x.size(1) <= cbm::CI_MAX,
                "x: (N, C <= 8, H, W) float32 contiguous CUDA");
    return cbm::MShape{static_cast<int>(x.size(0)), static_cast<int>(x.size(1)), static_cast<int>(x.size(2)),
                       static_cast<int>(x.size(3)), 0, 0, 0, false};
}
}  // namespace

// The border slots (1–24 of each combo) of x's moments into a zeroed acc: the book's kernel (S = 0) or the
// candidate (S = -1): per-sample partials, then their reduction.
torch::Tensor edge_sums(const torch::Tensor& x, int64_t S) {
    const cbm::MShape s = shape_of(x);
    torch::Tensor acc = torch::zeros({cbm::ACC_DOUBLES}, x.options().dtype(torch::kFloat64));
    const cudaStream_t st = c10::cuda::getCurrentCUDAStream().stream();
    const float* xp = x.data_ptr<float>();
    double* a = acc.data_ptr<double>();
    cudaError_t err = cudaErrorInvalidValue;
    if (S == 0) {
        cbm::moments_edge_kernel<<<dim3(static_cast<unsigned>(s.N), 4), cbm::E_THREADS, 0, st>>>(xp, s, a);
        err = cudaGetLastError();
    } else if (S == -1) {  // the partials and their reduction (the workspace is allocated outside the timed call
        static torch::Tensor part;  // in the book; here once per size)
        const int64_t need = static_cast<int64_t>(s.N) * edgem::V_PART * cbm::E_THREADS;
        if (!part.defined() || part.numel() < need || part.device() != x.device())
            part = torch::empty({need}, x.options());
        err = edgem::edge_partials(xp, s, part.data_ptr<float>(), a, st);
    }
    TORCH_CHECK(err == cudaSuccess, "edge_sums: ", cudaGetErrorString(err));
    return acc;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("edge_sums", &edge_sums); }
