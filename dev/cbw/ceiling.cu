// dev/cbw/ceiling.cu — the wgmma TF32 rate of m64n128k8 from shared memory in the layouts the convolution could use
// (dev/cbw/ceiling.py builds and times it). The book's ceiling (kernels/gemm_wgmma.cu) is m64n256k8 on the 128-byte
// swizzle; the convolution issues m64n128k8 on operands without swizzle, B's start shifted by 16-byte pixels. Each
// form here: 2 warpgroups a block, each multiplying its own A (64 × 32) and B (128 × 32) tiles of random TF32
// values, four k8 steps a round into one accumulator, one commit group in flight — nothing else in the loop.
// The setup (random fill, clocks) copies the book's ceiling kernel on purpose, so that only the wgmma form differs;
// sharing it would mean moving it out of kernels/gemm_wgmma.cu, which re-records chapters 6 and 8.
//   kSw 1: the 128-byte swizzle (rows of 32 floats, 1,024-byte atoms; a k step = 32 bytes of the start)
//   kSw 3: the 32-byte swizzle (rows of 8 floats = one k step, 256-byte atoms, SBO 256)
//   kSw 0: no swizzle (core matrices of 8 rows × 16 bytes, SBO 128; LBO the next 4 floats of K)
//   kShift 1: B's start moves by one row per k step (16 bytes without swizzle, 32 with the 32-byte swizzle), in a
//     cycle of three, as the convolution's taps move the input window (kSw 0 and 3 only). The values read are then
//     not the tiles' (the rate is what is measured; the products are not checked).
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

#include "conv_wgmma_x.cuh"  // cbwx::mma (m64n128k8, both operands from shared memory) and the wgmma helpers

namespace {
constexpr int kThreads = 256, kRowsB = 136;  // B rows: 128 + room for the shifts (and 17 atoms for kSw 3)
constexpr int kA = 64 * 32 * 4, kB = kRowsB * 32 * 4;       // bytes per warpgroup: 8 KiB and 17 KiB
constexpr int kSmem = 2 * (kA + kB) + 1024;

#ifdef KB_CBW
template <int kSw>
__device__ __forceinline__ uint64_t sdesc(uint32_t addr, int rows) {
    if (kSw == 1)
        return static_cast<uint64_t>((addr & 0x3ffff) >> 4) | (1ull << 16) | (uint64_t{1024 >> 4} << 32) | (1ull << 62);
    if (kSw == 3)
        return static_cast<uint64_t>((addr & 0x3ffff) >> 4) | (1ull << 16) | (uint64_t{256 >> 4} << 32) | (3ull << 62);
    return cbwx::desc(addr, rows * 16, 128);  // LBO: the next 4 floats of K are `rows` 16-byte rows on
}
// Where k step kk of an operand of `rows` rows starts.
template <int kSw>
__device__ __forceinline__ uint32_t kstep(uint32_t base, int kk, int rows) {
    return kSw == 1 ? base + 32 * kk : kSw == 3 ? base + kk * rows * 32 : base + 2 * kk * rows * 16;
}
#endif

template <int kSw, int kShift>
__global__ void __launch_bounds__(kThreads) ceiling_kernel(const unsigned* __restrict__ seeds, float* __restrict__ out,
                                                           long long* __restrict__ clocks, int iters) {
#ifdef KB_CBW
    extern __shared__ unsigned char raw[];
    const uint32_t base = (cbwx::smem_u32(raw) + 1023) & ~1023u;
    unsigned char* gbase = raw + (base - cbwx::smem_u32(raw));
    const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
    const uint32_t a = base + wg * (kA + kB), b = a + kA;
    uint32_t* words = reinterpret_cast<uint32_t*>(gbase + wg * (kA + kB));
    uint32_t x = seeds[threadIdx.x] | 1u;
    for (int i = t; i < (kA + kB) / 4; i += 128) {  // random mantissas, exponent of [1, 2): no overflow
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        words[i] = (x & 0x007fe000u) | 0x3f800000u;
    }
    cbwx::fence_proxy_async();
    __syncthreads();
    float d[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) d[i] = 0.f;
    constexpr int step = kSw == 3 ? 32 : 16;  // one B row
    unsigned long long ns0 = 0, ns1 = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns0));
    const long long cycles0 = clock64();
    for (int it = 0; it < iters; ++it) {
        cbwx::wg_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
            cbwx::mma(d, sdesc<kSw>(kstep<kSw>(a, kk, 64), 64),
                      sdesc<kSw>(kstep<kSw>(b, kk, kRowsB) + (kShift ? step * ((it + kk) % 3) : 0), kRowsB), 1);
        cbwx::wg_commit();
        cbwx::wg_wait<1>();
    }
    cbwx::wg_wait<0>();
    cbwx::fence_regs(d);
    const long long cycles1 = clock64();
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns1));
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < 64; ++i) sum += d[i];
    out[static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x] = sum;
    if (threadIdx.x == 0) {
        clocks[2 * blockIdx.x] = cycles1 - cycles0;
        clocks[2 * blockIdx.x + 1] = static_cast<long long>(ns1 - ns0);
    }
#endif
}

template <int kSw, int kShift>
void launch(const unsigned* seeds, float* out, long long* clocks, int blocks, int iters, cudaStream_t stream) {
    TORCH_CHECK(cudaFuncSetAttribute(ceiling_kernel<kSw, kShift>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     kSmem) == cudaSuccess, "ceiling: shared memory");
    ceiling_kernel<kSw, kShift><<<blocks, kThreads, kSmem, stream>>>(seeds, out, clocks, iters);
}
}  // namespace

// (out, clocks) of one launch of form (sw, shift); FLOP = blocks · 2 · iters · 4 · 2 · 64 · 128 · 8.
std::vector<torch::Tensor> ceiling(const torch::Tensor& seeds, int64_t sw, int64_t shift, int64_t blocks,
                                   int64_t iters) {
    TORCH_CHECK(seeds.is_cuda() && seeds.scalar_type() == torch::kInt32 && seeds.numel() >= kThreads, "seeds");
    TORCH_CHECK(blocks > 0 && blocks <= 65535 && iters > 0 && iters <= INT32_MAX, "blocks, iters");
    auto out = torch::empty({blocks * kThreads}, seeds.options().dtype(torch::kFloat32));
    auto clocks = torch::empty({blocks, 2}, seeds.options().dtype(torch::kInt64));
    const auto* s = reinterpret_cast<const unsigned*>(seeds.data_ptr<int32_t>());
    auto* c = reinterpret_cast<long long*>(clocks.data_ptr<int64_t>());
    const cudaStream_t st = c10::cuda::getCurrentCUDAStream().stream();
    const int nb = static_cast<int>(blocks), ni = static_cast<int>(iters);
    if (sw == 1 && shift == 0) launch<1, 0>(s, out.data_ptr<float>(), c, nb, ni, st);
    else if (sw == 3 && shift == 0) launch<3, 0>(s, out.data_ptr<float>(), c, nb, ni, st);
    else if (sw == 3 && shift == 1) launch<3, 1>(s, out.data_ptr<float>(), c, nb, ni, st);
    else if (sw == 0 && shift == 0) launch<0, 0>(s, out.data_ptr<float>(), c, nb, ni, st);
    else if (sw == 0 && shift == 1) launch<0, 1>(s, out.data_ptr<float>(), c, nb, ni, st);
    else TORCH_CHECK(false, "ceiling: sw in {0, 1, 3}, shift in {0, 1} (not with sw 1)");
    TORCH_CHECK(cudaGetLastError() == cudaSuccess, "ceiling: launch");
    return {out, clocks};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("ceiling", &ceiling, "one launch of the m64n128k8 rate kernel: (out, clocks)");
}
