// mappings.cpp — the torch binding of mappings.cu: y = x·a[c] + b[c] with a chosen thread mapping.
//
// a and b are CPU float32 tensors of C values: they are copied into the kernel's parameter block at
// launch (read from the constant bank), so that x and y are the kernels' only global memory traffic.
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <climits>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "mappings.h"
#include "torch_checks.h"

namespace {

constexpr const char* kOp = "affine";
// In launch_affine's numbering.
const std::vector<std::string> kMappings = {"flat",       "flat_vec4",           "channel_fastest", "pixel_loop",
                                            "tile_7x18x4", "tile_8x8x8",         "rows_w_x4",       "channel_fastest_smem",
                                            "flat_x4",     "flat_vec4_x4",        "planes_vec4_x4",  "flat_vec4_x4_i32"};

int mapping_number(const std::string& name) {
    std::string known;
    for (size_t k = 0; k < kMappings.size(); ++k) {
        if (kMappings[k] == name) return static_cast<int>(k);
        known += (k ? ", " : "") + kMappings[k];
    }
    KB_CHECK(false, kOp, ": unknown mapping '", name, "' (known: ", known, ")");
    return -1;
}

void check_coeffs(const torch::Tensor& t, int64_t c, const char* name) {
    KB_CHECK(t.scalar_type() == torch::kFloat32, kOp, ": ", name, " must be float32, got ",
             kb::dtype_name(t.scalar_type()));
    KB_CHECK(t.device().is_cpu(), kOp, ": ", name, " must be a CPU tensor (it is passed by value in the kernel's ",
             "parameter block), got a tensor on ", t.device().str());
    KB_CHECK(t.dim() == 1 && t.size(0) == c, kOp, ": ", name, " must have shape [", c,
             "] (one value per channel of x), got ", kb::shape_str(t.sizes()));
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

std::vector<std::string> mappings() { return kMappings; }

// The launch constants the chapter's model mirrors (kernelbook.coalescing reads the same numbers).
std::map<std::string, int64_t> config() {
    return {{"flat_threads", mappings_flat_threads()},
            {"unroll", mappings_unroll()},
            {"max_channels", mappings_max_channels()}};
}

// out = x·a[c] + b[c] over an (N, C, H, W) tensor, computed with the thread mapping `mapping`.
torch::Tensor affine(const torch::Tensor& x, const torch::Tensor& a, const torch::Tensor& b,
                     const std::string& mapping, const std::optional<torch::Tensor>& out) {
    const int m = mapping_number(mapping);
    kb::check_dim(x, 4, "(N, C, H, W)", kOp, "x");
    kb::check_tensor(x, kOp, "x");
    const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
    KB_CHECK(c >= 1 && c <= mappings_max_channels(), kOp, ": x must have 1 to ", mappings_max_channels(),
             " channels (the coefficients live in the kernel's parameter block), got shape ", kb::shape_str(x.sizes()));
    check_coeffs(a, c, "a");
    check_coeffs(b, c, "b");
    auto a32 = a.contiguous(), b32 = b.contiguous();
    torch::Tensor y = out ? *out : torch::empty_like(x);
    if (out) {
        kb::check_tensor(y, kOp, "out");
        kb::check_shape(y, x.sizes(), kOp, "out");
        kb::check_same_device(x, y, kOp, "x", "out");
        kb::check_no_overlap(x, y, kOp, "x", "out");
    }
    if (m == 1 || m == 9 || m == 11) {  // float4 accesses over the flat index
        KB_CHECK(x.numel() % 4 == 0, kOp, ": mapping ", mapping, " needs a number of elements divisible by 4, got ",
                 x.numel(), " for shape ", kb::shape_str(x.sizes()));
        KB_CHECK(aligned16(x.data_ptr()) && aligned16(y.data_ptr()), kOp, ": mapping ", mapping,
                 " needs x and out to start on 16-byte boundaries (a view such as x[1:] does not)");
    }
    if (m == 11) {
        KB_CHECK(x.numel() < (int64_t{1} << 31), kOp, ": mapping flat_vec4_x4_i32 computes its indices in 32 bits, ",
                 "so x must have fewer than 2^31 elements, got ", x.numel(), " (use flat_vec4_x4)");
    }
    if (m == 10) {  // planes_vec4_x4 takes float4 accesses when it can and scalar ones otherwise
        KB_CHECK(n * c <= INT_MAX && (h * w + 4095) / 4096 <= 65535, kOp, ": mapping planes_vec4_x4 launches one ",
                 "block row per (n, c) plane (N·C = ", n * c, ", at most ", INT_MAX, ") and ceil(H·W / 4096) = ",
                 (h * w + 4095) / 4096, " blocks per plane (at most 65535)");
    }
    if (m == 4 || m == 5) {
        const int64_t tc = m == 4 ? 4 : 8, th = m == 4 ? 7 : 8;
        KB_CHECK(n * ((c + tc - 1) / tc) <= 65535 && (h + th - 1) / th <= 65535, kOp, ": mapping ", mapping,
                 " covers N·ceil(C/", tc, ") = ", n * ((c + tc - 1) / tc), " channel tiles and ceil(H/", th, ") = ",
                 (h + th - 1) / th, " row tiles; each must be at most 65535 (gridDim.z and gridDim.y)");
    }
    if (m == 6) {
        KB_CHECK(w <= 256, kOp, ": mapping rows_w_x4 uses blocks of W × 4 threads, so W must be at most 256, got ",
                 w);
    }
    const int64_t threads = m == 1 ? x.numel() / 4 : m == 3 ? n * h * w : m == 8 ? x.numel() / 4
                            : m == 9 || m == 11 ? x.numel() / 16 : m == 10 ? 0 : x.numel();
    KB_CHECK(threads / 256 < INT_MAX, kOp, ": tensor too large for a 1-D grid: ", x.numel(), " elements");
    if (x.numel() == 0) return y;

    const c10::cuda::CUDAGuard guard(x.device());
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
    kb::check_launch(launch_affine(m, x.data_ptr<float>(), y.data_ptr<float>(), a32.data_ptr<float>(),
                                   b32.data_ptr<float>(), n, c, h, w, stream),
                     kOp);
    return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("mappings", &mappings, "The thread mappings affine() knows, in the chapter's order");
    m.def("config", &config, "The launch constants of kernels/mappings.cu (threads per block, unroll, channels)");
    m.def("affine", &affine, "y = x·a[c] + b[c] for an NCHW float32 CUDA tensor x, with the given thread mapping",
          pybind11::arg("x"), pybind11::arg("a"), pybind11::arg("b"), pybind11::arg("mapping"),
          pybind11::arg("out") = pybind11::none());
}
