// cutlass_gemm.cpp — the torch binding of cutlass_gemm.cu: validate, allocate, launch on PyTorch's stream.
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <climits>
#include <cstdint>

#include "cutlass_gemm.h"
#include "sm_checks.h"
#include "torch_checks.h"

namespace {

constexpr const char* kOp = "cutlass_gemm";

void check_passes_tile(int64_t passes, int64_t tile) {
    KB_CHECK(passes == 1 || passes == 3, kOp, ": passes must be 3 (3xTF32) or 1 (TF32), got ", passes);
    const int n = cutlass_gemm_tiles(static_cast<int>(passes));
    KB_CHECK(tile >= 0 && tile < n, kOp, ": tile must be 0 to ", n - 1, " for passes=", passes, ", got ", tile);
}

}  // namespace

// C = A·B with CUTLASS's TF32 (passes=1) or 3xTF32 (passes=3) GEMM and block tile `tile`.
torch::Tensor cutlass_gemm(const torch::Tensor& a, const torch::Tensor& b, int64_t passes, int64_t tile) {
    for (const auto& [t, name] : {std::pair{&a, "a"}, std::pair{&b, "b"}}) {
        kb::check_tensor(*t, kOp, name);
        kb::check_dim(*t, 2, "(rows, columns)", kOp, name);
        KB_CHECK(t->size(0) <= INT_MAX && t->size(1) <= INT_MAX, kOp, ": ", name, " is too large for 32-bit indices");
        kb::check_aligned16(*t, kOp, name);
    }
    kb::check_same_device(a, b, kOp, "a", "b");
    check_passes_tile(passes, tile);
    const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
    KB_CHECK(b.size(0) == K, kOp, ": a is ", M, "x", K, " but b is ", b.size(0), "x", N, ": inner sizes differ");
    KB_CHECK(K % 4 == 0 && N % 4 == 0, kOp, ": K and N must be multiples of 4 (CUTLASS copies 16 bytes at a time), ",
             "got K=", K, " N=", N);
    const c10::cuda::CUDAGuard guard(a.device());
    kb::require_tf32_tensor_cores(a, kOp);
    auto c = torch::empty({M, N}, a.options());
    if (M == 0 || N == 0) return c;
    if (K == 0) return c.zero_();
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(a.device().index()).stream();
    kb::check_launch(launch_cutlass_gemm(a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(),
                                         static_cast<int>(M), static_cast<int>(N), static_cast<int>(K),
                                         static_cast<int>(passes), static_cast<int>(tile), stream),
                     kOp);
    return c;
}

// The block tiles there are for `passes`: one dict each (bm, bn, bk, wm, wn, stages).
pybind11::list tiles(int64_t passes) {
    KB_CHECK(passes == 1 || passes == 3, kOp, ": passes must be 3 (3xTF32) or 1 (TF32), got ", passes);
    pybind11::list out;
    for (int i = 0; i < cutlass_gemm_tiles(static_cast<int>(passes)); ++i) {
        int s[6];
        cutlass_gemm_tile(static_cast<int>(passes), i, s);
        pybind11::dict d;
        d["bm"] = s[0], d["bn"] = s[1], d["bk"] = s[2], d["wm"] = s[3], d["wn"] = s[4], d["stages"] = s[5];
        out.append(d);
    }
    return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("cutlass_gemm", &cutlass_gemm,
          "C = A @ B with CUTLASS's tensor-core GEMM: passes=3 its 3xTF32 split (OpMultiplyAddFastF32), 1 plain TF32",
          pybind11::arg("a"), pybind11::arg("b"), pybind11::arg("passes") = 3, pybind11::arg("tile") = 0);
    m.def("tiles", &tiles, "the block tiles cutlass_gemm has for `passes`: bm, bn, bk, wm, wn, stages",
          pybind11::arg("passes") = 3);
}
