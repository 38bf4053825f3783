// bn_train.cu — BatchNorm2d followed by a scale factor, fused: y = BN(x)·s, NCHW float32.
//
// The statistics' finalize, the running-statistics update and the apply map are bn_stats.cuh's (shared with
// chapter 7); this file's launch API is declared in bn_train.h.
//
// Training mode (what PyTorch does when the module was never put in .eval()):
//   1. bn_stats_kernel: one read of x. Block (c, s) summarises slice s of channel c as a Welford
//      state (count, mean, M2), merged with Chan's formula across the thread's registers, the warp
//      (shuffles), the block (shared memory) and, by the last block of each channel to finish, across
//      blocks — in double. That block then writes the channel's map y = (x − m)·a + b,
//          m = mean,  a = γ·s/√(var + ε),  b = β·s,   var the *biased* batch variance,
//      and updates the running statistics in place: running_mean ← (1−m)·running_mean + m·mean and
//      running_var ← (1−m)·running_var + m·var_unbiased (m = momentum, or 1/(batches + 1) when
//      momentum is None: PyTorch's cumulative average).
//   2. bn_apply_kernel: one read of x and one write of y, y = (x − m[c])·a[c] + b[c] (a subtraction
//      and an FMA per element: subtracting first keeps the error relative to y, not to x, even
//      when the mean dwarfs the spread; folding m into b would save one instruction and lose that);
//      block (0, 0) also counts the batch (num_batches_tracked += 1).
// Eval mode is step 2 alone, with a and b computed per block from the running statistics.
//
// Memory traffic in training mode: 3 passes over the tensor (read, read, write) — the minimum for a
// batch-norm that is handed the tensor: its statistics must be known before the first output is
// written. (Fused with the convolution that produces x, the statistics can also come from recomputing
// the convolution or from the input's moments; chapter 7 does the latter.)
//
// The stats grid is sized by the occupancy API (bn_stats_resident_blocks): at most one wave.
#include <cuda_runtime.h>

#include <atomic>
#include <climits>
#include <cstdint>

#include "bn_stats.cuh"
#include "bn_train.h"
#include "welford.cuh"

namespace {

using kb::normalise;
using kb::Vec;

constexpr int kThreads = kb::kBnThreads;  // 8 warps
constexpr int kUnroll = kb::kBnUnroll;    // vector loads in flight per thread per loop trip
// The stats grid is at most one wave: as many blocks as the GPU holds at once, as the occupancy API
// reports for bn_stats_kernel's registers and shared memory (bn_stats_resident_blocks), never a guess.
// A block's state counts its values in float: keep each block's share under 2^24 values.
constexpr int64_t kMaxValuesPerBlock = int64_t{1} << 22;

__device__ __forceinline__ void unpack(const float4& v, float* out) { out[0] = v.x; out[1] = v.y; out[2] = v.z; out[3] = v.w; }
__device__ __forceinline__ void unpack(const float& v, float* out) { out[0] = v; }

struct Params {
    const float* x;
    float* y;
    const float* weight;        // γ, or null (affine=False: γ = 1)
    const float* bias;          // β, or null (β = 0)
    float* running_mean;        // or null (track_running_stats=False)
    float* running_var;
    int64_t* num_batches_tracked;  // or null
    float* mean_out;            // [C] batch mean (training), for the caller
    float* var_out;             // [C] biased batch variance (training)
    float* mab;                 // [4C] workspace: m_hi, m_lo, a, b per channel (bn_stats.cuh)
    kb::Welford<float>* partial;// [C * splits] workspace: one state per stats block
    unsigned* arrivals;         // [C] counters, zeroed by the caller: stats blocks of each channel done
    int64_t N, C, HW;
    int splits;                 // stats blocks per channel
    float momentum;             // < 0: cumulative average (momentum=None)
    float eps, scale;
};

// Work items (V floats each) of channel c, numbered j = n·(HW/V) + w, live at plane (n, c), item w.
template <int V>
__global__ void __launch_bounds__(kThreads) bn_stats_kernel(Params p) {
    using VT = typename Vec<V>::T;
    __shared__ kb::Welford<float> scratch[kThreads / 32];
    __shared__ bool last;
    __shared__ float pivot_s;
    const int c = blockIdx.x;
    if (threadIdx.x < 32) {  // warp 0: the channel's pivot (the same in every block of the channel)
        const float pv = kb::bn_pivot(p.x, p.N, p.C, p.HW, c);
        if (threadIdx.x == 0) pivot_s = pv;
    }
    __syncthreads();
    const float pivot = pivot_s;
    const int s = blockIdx.y;
    const int64_t items_per_plane = p.HW / V;
    const int64_t items = p.N * items_per_plane;
    const int64_t chunk = (items + p.splits - 1) / p.splits;
    const int64_t begin = s * chunk;
    const int64_t end = begin + chunk < items ? begin + chunk : items;

    // (n, w) of this thread's first item; then step by kThreads items = dn planes and dw items.
    int64_t j = begin + threadIdx.x;
    int64_t n = j / items_per_plane, w = j - n * items_per_plane;
    const int64_t dn = kThreads / items_per_plane, dw = kThreads % items_per_plane;
    const VT* __restrict__ x = reinterpret_cast<const VT*>(p.x);
    kb::Welford<float> st{0.f, 0.f, 0.f};
    // excerpt: stats_loop
    while (j < end) {
        float v[kUnroll * V];
        int k = 0;  // values loaded this trip
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            if (j < end) {
                unpack(x[(n * p.C + c) * items_per_plane + w], v + u * V);
                k += V;
                j += kThreads;
                n += dn;
                w += dw;
                if (w >= items_per_plane) { w -= items_per_plane; ++n; }
            }
        }
#pragma unroll
        for (int i = 0; i < kUnroll * V; ++i) v[i] -= pivot;  // exact near the pivot (Sterbenz)
        kb::welford_merge(st, kb::welford_of(v, k));
    }
    st = kb::welford_block_reduce(st, scratch);
    // end excerpt: stats_loop

    // excerpt: last_block
    if (threadIdx.x == 0) {
        p.partial[c * p.splits + s] = st;
        __threadfence();  // publish the state before announcing it
        last = atomicAdd(&p.arrivals[c], 1u) == static_cast<unsigned>(p.splits) - 1;
    }
    __syncthreads();
    if (!last || threadIdx.x >= 32) return;

    // The last block of channel c: warp 0 merges the channel's states in double precision.
    __threadfence();
    kb::Welford<double> tot{0.0, 0.0, 0.0};
    for (int i = threadIdx.x; i < p.splits; i += 32) {
        const kb::Welford<float>* q = p.partial + c * p.splits + i;
        const kb::Welford<double> b{__ldcg(&q->n), __ldcg(&q->mean), __ldcg(&q->m2)};
        kb::welford_merge(tot, b);
    }
    tot = kb::welford_warp_reduce(tot);
    if (threadIdx.x != 0) return;
    tot.mean += static_cast<double>(pivot);  // the states were about the pivot; M2 does not depend on it
    // end excerpt: last_block

    // The map, the running statistics (bn_stats.cuh), and the batch's mean and biased variance for the caller.
    const double var = kb::bn_finish_channel(tot, c, p.C, p.mab, p.weight, p.bias, p.running_mean, p.running_var,
                                             p.num_batches_tracked, p.momentum, p.eps, p.scale);
    p.mean_out[c] = static_cast<float>(tot.mean);
    p.var_out[c] = static_cast<float>(var);
}

// y = ((x − m_hi[c]) − m_lo[c])·a[c] + b[c] over plane (n, c) = blockIdx.x, tile blockIdx.y of kThreads·kUnroll
// items.
template <int V, bool kEval>
__global__ void __launch_bounds__(kThreads) bn_apply_kernel(Params p) {
    using VT = typename Vec<V>::T;
    const int64_t plane = blockIdx.x;
    const int c = static_cast<int>(plane % p.C);
    kb::BnApply map;
    if (kEval) {  // from the running statistics (a handful of loads per block); a float mean is exact
        const float g = p.weight ? p.weight[c] : 1.f;
        const float be = p.bias ? p.bias[c] : 0.f;
        map = kb::BnApply{p.running_mean[c], 0.f, g * p.scale / sqrtf(p.running_var[c] + p.eps), be * p.scale};
    } else {
        map = kb::bn_apply_of(p.mab, p.C, c);
        if (plane == 0 && blockIdx.y == 0 && threadIdx.x == 0 && p.num_batches_tracked)
            *p.num_batches_tracked += 1;  // after every stats block has read it (stream order)
    }
    const int64_t items_per_plane = p.HW / V;
    const VT* __restrict__ x = reinterpret_cast<const VT*>(p.x) + plane * items_per_plane;
    VT* __restrict__ y = reinterpret_cast<VT*>(p.y) + plane * items_per_plane;
    // excerpt: apply
    const int64_t base = static_cast<int64_t>(blockIdx.y) * kThreads * kUnroll + threadIdx.x;
    VT v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {  // all loads first (kUnroll in flight), then the stores
        const int64_t i = base + u * kThreads;
        if (i < items_per_plane) v[u] = x[i];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
        const int64_t i = base + u * kThreads;
        if (i < items_per_plane) y[i] = normalise(v[u], map);
    }
    // end excerpt: apply
}

// float4 path when every plane starts on a 16-byte boundary.
bool use_vec4(const Params& p) { return kb::bn_vec4(p.x, p.y, p.HW); }

// The apply grid (bn_stats.cuh): one block per (plane, tile).
bool apply_grid(const Params& p, dim3* grid) { return kb::bn_apply_grid(p.N, p.C, p.HW, use_vec4(p) ? 4 : 1, grid); }

cudaError_t launch_apply(const Params& p, bool eval, cudaStream_t stream) {
    const int V = use_vec4(p) ? 4 : 1;
    dim3 grid;
    if (!apply_grid(p, &grid)) return cudaErrorInvalidValue;
    if (V == 4 && eval) bn_apply_kernel<4, true><<<grid, kThreads, 0, stream>>>(p);
    else if (V == 4) bn_apply_kernel<4, false><<<grid, kThreads, 0, stream>>>(p);
    else if (eval) bn_apply_kernel<1, true><<<grid, kThreads, 0, stream>>>(p);
    else bn_apply_kernel<1, false><<<grid, kThreads, 0, stream>>>(p);
    return cudaGetLastError();
}

}  // namespace

int64_t bn_max_plane() { return kb::bn_apply_max_plane(); }

// The kernels' compile-time constants, for the chapter's diagrams and tables (never retyped there).
void bn_train_config(int* threads, int* unroll, int64_t* max_values_per_block) {
    *threads = kThreads;
    *unroll = kUnroll;
    *max_values_per_block = kMaxValuesPerBlock;
}

// Whether the kernels take the float4 path for these pointers and planes (else the scalar one).
bool bn_train_vec4(const float* x, const float* y, int64_t HW) { return kb::bn_vec4(x, y, HW); }

// Blocks of bn_stats_kernel the current device holds at once (SMs × resident blocks per SM), from
// the occupancy API: the kernel's registers and shared memory decide. Asked once per device and path.
cudaError_t bn_stats_resident_blocks(bool vec4, int* sm_count, int* blocks_per_sm) {
    constexpr int kCachedDevices = 64;
    static std::atomic<int> cache[kCachedDevices][2][2] = {};  // [device][vec4][sms, per SM]
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) return err;
    const bool cached = device < kCachedDevices && cache[device][vec4][1].load() > 0;
    int sms = cached ? cache[device][vec4][0].load() : 0;
    int per_sm = cached ? cache[device][vec4][1].load() : 0;
    // excerpt: occupancy
    if (!cached) {
        err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
        if (err == cudaSuccess)
            err = vec4 ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, bn_stats_kernel<4>, kThreads, 0)
                       : cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, bn_stats_kernel<1>, kThreads, 0);
        if (err != cudaSuccess) return err;
        if (per_sm < 1) per_sm = 1;
        if (device < kCachedDevices) {
            cache[device][vec4][0].store(sms);
            cache[device][vec4][1].store(per_sm);
        }
    }
    *sm_count = sms;
    *blocks_per_sm = per_sm;
    return cudaSuccess;
}

// Stats blocks per channel for an (N, C, HW) input: one wave at most — the resident blocks shared
// out over the channels, rounded down (a partial second wave would leave most SMs idle at its end) —
// but at least enough that no block's share exceeds kMaxValuesPerBlock, at most one per work item.
int bn_train_splits(int64_t N, int64_t C, int64_t HW, int resident_blocks) {
    if (C < 1 || N * HW < 1) return 1;
    const int64_t values = N * HW;
    int64_t splits = int64_t{resident_blocks} / C;
    if (splits < 1) splits = 1;
    const int64_t min_splits = (values + kMaxValuesPerBlock - 1) / kMaxValuesPerBlock;
    if (splits < min_splits) splits = min_splits;
    const int64_t items = HW % 4 == 0 ? values / 4 : values;
    if (splits > items) splits = items;
    if (splits > 65535) splits = 65535;
    return static_cast<int>(splits < 1 ? 1 : splits);
}
// end excerpt: occupancy

// Floats of workspace for the stats blocks' partial states.
int64_t bn_train_partial_floats(int64_t C, int splits) {
    return C * splits * static_cast<int64_t>(sizeof(kb::Welford<float>) / sizeof(float));
}

// Training-mode forward. Workspaces: partial [C·splits] states, mab [4C], arrivals [C] zeroed.
cudaError_t launch_bn_scale_train(const float* x, float* y, const float* weight, const float* bias,
                                  float* running_mean, float* running_var, int64_t* num_batches_tracked,
                                  float* mean_out, float* var_out, float* mab, void* partial, unsigned* arrivals,
                                  int64_t N, int64_t C, int64_t HW, int splits, float momentum, float eps,
                                  float scale, cudaStream_t stream) {
    if (N * C * HW == 0) return cudaSuccess;
    Params p{x, y, weight, bias, running_mean, running_var, num_batches_tracked, mean_out, var_out, mab,
             static_cast<kb::Welford<float>*>(partial), arrivals, N, C, HW, splits, momentum, eps, scale};
    dim3 apply;  // validate both grids before the first launch: never update the running stats and then fail
    if (C > INT_MAX || splits > 65535 || !apply_grid(p, &apply)) return cudaErrorInvalidValue;
    const dim3 grid(static_cast<unsigned>(C), static_cast<unsigned>(splits));
    if (use_vec4(p))
        bn_stats_kernel<4><<<grid, kThreads, 0, stream>>>(p);
    else
        bn_stats_kernel<1><<<grid, kThreads, 0, stream>>>(p);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return launch_apply(p, /*eval=*/false, stream);
}

// Eval-mode forward: y = BN(x)·s with the running statistics.
cudaError_t launch_bn_scale_eval(const float* x, float* y, const float* weight, const float* bias,
                                 const float* running_mean, const float* running_var, int64_t N, int64_t C,
                                 int64_t HW, float eps, float scale, cudaStream_t stream) {
    if (N * C * HW == 0) return cudaSuccess;
    Params p{x, y, weight, bias, const_cast<float*>(running_mean), const_cast<float*>(running_var), nullptr,
             nullptr, nullptr, nullptr, nullptr, nullptr, N, C, HW, 0, 0.f, eps, scale};
    return launch_apply(p, /*eval=*/true, stream);
}
