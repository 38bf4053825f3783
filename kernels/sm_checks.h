// sm_checks.h — what a binding checks of the GPU itself (torch side; included after torch_checks.h).
#pragma once

#include "torch_checks.h"

namespace kb {

// The compute capability of t's GPU, as 10·major + minor.
inline int compute_capability(const torch::Tensor& t, const char* fn) {
    int major = 0, minor = 0;
    check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, t.device().index()), fn,
               "reading the GPU's compute capability");
    check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, t.device().index()), fn,
               "reading the GPU's compute capability");
    return 10 * major + minor;
}

// Refuses, naming the GPU, where there are no TF32 tensor cores (before sm_80).
inline void require_tf32_tensor_cores(const torch::Tensor& t, const char* fn) {
    const int cc = compute_capability(t, fn);
    KB_CHECK(cc >= 80, fn, ": needs tensor cores with TF32 (sm_80 or newer); this GPU is sm_", cc);
}

// Kernels that copy 16 bytes at a time need their tensors to start on a 16-byte boundary.
inline void check_aligned16(const torch::Tensor& t, const char* fn, const char* name) {
    KB_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, fn, ": ", name,
             " must start on a 16-byte boundary (tiles are copied 16 bytes at a time)");
}

}  // namespace kb
