// group_stats.cu — per-(sample, group) mean and biased variance of an (N, C, S) float32 tensor, four ways,
// and a GroupNorm forward built on the stable one.
//
// With G groups, group (n, g) is the contiguous run of L = (C/G)·S values starting at (n·G + g)·L: the
// statistics are a segmented reduction over rows = N·G rows of length L. Block (row, split) reduces the
// split-th slice of a row's float4 items; each thread loads kUnroll float4 (kTrip values) per loop trip.
// A row whose start is not 16-byte aligned begins with up to 3 scalar "head" values, and a row whose
// length is not a multiple of 4 ends with up to 3 "tail" values: split 0 takes those, one per thread.
//   kOnePass     Σx and Σx² in float, then var = Σx²/L − (Σx/L)²: one read; cancels when |μ| ≫ σ.
//   kOnePassF64  the same sums accumulated in double: a float's square is exact in double (24 + 24 bits
//                of significand fit in 53), so the sums carry 29 more bits into the same subtraction,
//                which then loses log10((μ/σ)²) of double's 16 digits instead of float's 7.
//   kSum         Σx → mean (first pass of two-pass).
//   kCentered    Σd and Σd², d = x − mean → var = (Σd² − (Σd)²/L)/L (second pass; the corrected two-pass
//                formula of Chan, Golub & LeVeque: the (Σd)² term removes the error of the rounded mean).
//   kWelford     Welford states (count, mean, M2): a thread turns each trip's values into an exact state by
//                two passes over its registers (kb::welford_of) and merges it into its own with Chan's
//                formula; states merge across the warp (shuffles), the block (shared memory) and the row's
//                blocks. Values are first shifted by a pivot K = the row's first value (x − K is exact
//                when x is within a factor 2 of K): Chan's merge rounds each state's mean to a float of
//                size |μ|, and that rounding enters M2 at first order (error ∝ u·|μ|/σ); with the shift the
//                states hold means of size |μ − K| ≈ σ. kWelfordNoShift is the same without the shift.
// Rows with more than one block (few rows, long rows: N·G small against the SM count) write one partial
// result per block, and a finalising kernel merges them — one warp per row, Welford states in double.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <type_traits>

#include "group_stats.h"
#include "welford.cuh"

namespace {

constexpr int kThreads = 256;              // 8 warps
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 4;                 // float4 loads in flight per thread per trip
constexpr int kTrip = 4 * kUnroll;         // values per thread per trip
constexpr int kBlocksPerSM = 8;            // 8 × 256 threads: a full SM of sm_80/sm_90 (2048 threads)
// A split gets at least 2 trips per thread, and at most 2^20 float4 items: its count (≤ 4·2^20 + 6
// values) stays exact in a float, whose integers are exact up to 2^24.
constexpr int64_t kMinItemsPerSplit = int64_t{2} * kThreads * kUnroll;
constexpr int64_t kMaxItemsPerSplit = int64_t{1} << 20;

enum Algo : int { kOnePass = 0, kSum = 1, kCentered = 2, kWelford = 3, kWelfordNoShift = 4, kOnePassF64 = 5 };

struct Params {
    const float* x;
    float* mean;      // [rows]
    float* var;       // [rows]
    float* partial;   // [rows · splits · 4] when splits > 1 (kOnePassF64: 2 doubles per split)
    int64_t rows, L;
    int splits;
};

// Two sums (Σx, Σx²), (Σx, unused) or (Σd, Σd²): in float, or in double for kOnePassF64.
template <typename T>
struct Pair {
    T a, b;
};

// The accumulator type of a pair algorithm.
template <int A>
using Acc = typename std::conditional<A == kOnePassF64, double, float>::type;

template <typename T>
__device__ __forceinline__ Pair<T> pair_warp_reduce(Pair<T> s) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        s.a += __shfl_down_sync(0xffffffffu, s.a, offset);
        s.b += __shfl_down_sync(0xffffffffu, s.b, offset);
    }
    return s;
}

// Every thread of the block calls this; thread 0 ends with the total.
template <typename T>
__device__ __forceinline__ Pair<T> pair_block_reduce(Pair<T> s, Pair<T>* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    s = pair_warp_reduce(s);
    if (lane == 0) scratch[warp] = s;
    __syncthreads();
    if (warp == 0) {
        s = lane < kWarps ? scratch[lane] : Pair<T>{T(0), T(0)};
        s = pair_warp_reduce(s);
    }
    return s;
}

// Where the row's values are: `head` scalars up to the first 16-byte boundary, `items` float4, `tail` scalars.
struct Row {
    const float* base;
    int64_t head, items, tail_start;
    int tail;
};

__device__ __forceinline__ Row row_layout(const float* x, int64_t row, int64_t L) {
    Row r;
    r.base = x + row * L;
    const int mis = static_cast<int>((reinterpret_cast<uintptr_t>(r.base) >> 2) & 3);  // floats past a boundary
    r.head = mis ? 4 - mis : 0;
    if (r.head > L) r.head = L;
    r.items = (L - r.head) / 4;
    r.tail_start = r.head + 4 * r.items;
    r.tail = static_cast<int>(L - r.tail_start);
    return r;
}

// The row's row-constant: the pivot K (Welford), the mean (second pass of two-pass), else 0.
template <int A>
__device__ __forceinline__ float row_center(const Params& p, const Row& r, int64_t row) {
    if constexpr (A == kWelford) return r.base[0];
    else if constexpr (A == kCentered) return p.mean[row];
    else return 0.f;
}

// Results of the whole row: write them.
template <int A>
__device__ __forceinline__ void finish_pair(const Params& p, int64_t row, Pair<Acc<A>> s) {
    const Acc<A> n = static_cast<Acc<A>>(p.L);
    if constexpr (A == kOnePass || A == kOnePassF64) {
        const Acc<A> mean = s.a / n;
        p.mean[row] = static_cast<float>(mean);
        p.var[row] = static_cast<float>(s.b / n - mean * mean);  // the one-pass formula: may be negative
    } else if constexpr (A == kSum) {
        p.mean[row] = s.a / n;
    } else {  // kCentered
        p.var[row] = (s.b - s.a * s.a / n) / n;
    }
}

template <int A>
__global__ void __launch_bounds__(kThreads) pair_stats_kernel(Params p) {
    using T = Acc<A>;
    __shared__ Pair<T> scratch[kWarps];
    const int64_t row = blockIdx.x;
    const int split = blockIdx.y;
    const Row r = row_layout(p.x, row, p.L);
    const float c = row_center<A>(p, r, row);
    const int64_t chunk = (r.items + p.splits - 1) / p.splits;
    const int64_t begin = split * chunk;
    const int64_t end = begin + chunk < r.items ? begin + chunk : r.items;
    const float4* __restrict__ x4 = reinterpret_cast<const float4*>(r.base + r.head);

    Pair<T> s{T(0), T(0)};
    // excerpt: pair-loop
    for (int64_t j = begin + threadIdx.x; j < end; j += kThreads * kUnroll) {
        float4 v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {  // loads first, all in flight; missing ones contribute d = 0
            const int64_t i = j + u * kThreads;
            v[u] = i < end ? x4[i] : make_float4(c, c, c, c);
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const float e[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const T d = static_cast<T>(e[q] - c);  // c = 0 except in the centred pass
                s.a += d;
                if constexpr (A != kSum) s.b = fma(d, d, s.b);  // double: d·d exact
            }
        }
    }
    // end excerpt: pair-loop
    if (split == 0) {  // head and tail scalars, one per thread
        int64_t idx = -1;
        if (threadIdx.x < r.head) idx = threadIdx.x;
        else if (threadIdx.x >= 4 && threadIdx.x < 4 + r.tail) idx = r.tail_start + threadIdx.x - 4;
        if (idx >= 0) {
            const T d = static_cast<T>(r.base[idx] - c);
            s.a += d;
            if constexpr (A != kSum) s.b = fma(d, d, s.b);
        }
    }
    s = pair_block_reduce(s, scratch);
    if (threadIdx.x != 0) return;
    if (p.splits == 1) {
        finish_pair<A>(p, row, s);
    } else if constexpr (A == kOnePassF64) {  // 2 doubles in the split's 4 floats (16-byte aligned)
        double* q = reinterpret_cast<double*>(p.partial) + (row * p.splits + split) * 2;
        q[0] = s.a;
        q[1] = s.b;
    } else {
        float* q = p.partial + (row * p.splits + split) * 4;
        q[0] = s.a;
        q[1] = s.b;
    }
}

template <int A>
__global__ void __launch_bounds__(kThreads) welford_stats_kernel(Params p) {
    __shared__ kb::Welford<float> scratch[kWarps];
    const int64_t row = blockIdx.x;
    const int split = blockIdx.y;
    const Row r = row_layout(p.x, row, p.L);
    const float k0 = row_center<A>(p, r, row);  // pivot (0 without the shift)
    const int64_t chunk = (r.items + p.splits - 1) / p.splits;
    const int64_t begin = split * chunk;
    const int64_t end = begin + chunk < r.items ? begin + chunk : r.items;
    const float4* __restrict__ x4 = reinterpret_cast<const float4*>(r.base + r.head);

    kb::Welford<float> st{0.f, 0.f, 0.f};
    // excerpt: welford-loop
    for (int64_t j = begin + threadIdx.x; j < end; j += kThreads * kUnroll) {
        float4 q[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int64_t i = j + u * kThreads;
            q[u] = i < end ? x4[i] : make_float4(0.f, 0.f, 0.f, 0.f);
        }
        float v[kTrip];
        int k = 0;  // the valid values are a prefix of v: item i < end implies every earlier u's item too
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            v[4 * u] = q[u].x - k0;
            v[4 * u + 1] = q[u].y - k0;
            v[4 * u + 2] = q[u].z - k0;
            v[4 * u + 3] = q[u].w - k0;
            k += j + u * kThreads < end ? 4 : 0;
        }
        kb::welford_merge(st, kb::welford_of(v, k));
    }
    // end excerpt: welford-loop
    if (split == 0) {
        int64_t idx = -1;
        if (threadIdx.x < r.head) idx = threadIdx.x;
        else if (threadIdx.x >= 4 && threadIdx.x < 4 + r.tail) idx = r.tail_start + threadIdx.x - 4;
        if (idx >= 0) kb::welford_merge(st, kb::Welford<float>{1.f, r.base[idx] - k0, 0.f});
    }
    st = kb::welford_block_reduce(st, scratch);
    if (threadIdx.x != 0) return;
    if (p.splits == 1) {
        p.mean[row] = k0 + st.mean;
        p.var[row] = st.m2 / st.n;
    } else {
        float* q = p.partial + (row * p.splits + split) * 4;
        q[0] = st.n;
        q[1] = st.mean;
        q[2] = st.m2;
    }
}

// One warp per row merges the row's `splits` partial results. A row is warp-uniform, so a warp returns
// as a whole or not at all: the shuffles below always run with all 32 lanes.
template <int A>
__global__ void __launch_bounds__(kThreads) finalize_kernel(Params p) {
    const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= p.rows) return;
    const float* q = p.partial + row * p.splits * 4;
    if constexpr (A == kWelford || A == kWelfordNoShift) {
        kb::Welford<double> tot{0.0, 0.0, 0.0};
        for (int i = lane; i < p.splits; i += 32)
            kb::welford_merge(tot, kb::Welford<double>{q[4 * i], q[4 * i + 1], q[4 * i + 2]});
        tot = kb::welford_warp_reduce(tot);
        if (lane == 0) {
            const float k0 = A == kWelford ? p.x[row * p.L] : 0.f;
            p.mean[row] = k0 + static_cast<float>(tot.mean);
            p.var[row] = static_cast<float>(tot.m2 / tot.n);
        }
    } else if constexpr (A == kOnePassF64) {
        const double* qd = reinterpret_cast<const double*>(q);
        Pair<double> s{0.0, 0.0};
        for (int i = lane; i < p.splits; i += 32) {
            s.a += qd[2 * i];
            s.b += qd[2 * i + 1];
        }
        s = pair_warp_reduce(s);
        if (lane == 0) finish_pair<A>(p, row, s);
    } else {
        Pair<float> s{0.f, 0.f};
        for (int i = lane; i < p.splits; i += 32) {
            s.a += q[4 * i];
            s.b += q[4 * i + 1];
        }
        s = pair_warp_reduce(s);
        if (lane == 0) finish_pair<A>(p, row, s);
    }
}

template <int A>
cudaError_t launch_pass(const Params& p, cudaStream_t stream) {
    const dim3 grid(static_cast<unsigned>(p.rows), static_cast<unsigned>(p.splits));
    if constexpr (A == kWelford || A == kWelfordNoShift)
        welford_stats_kernel<A><<<grid, kThreads, 0, stream>>>(p);
    else
        pair_stats_kernel<A><<<grid, kThreads, 0, stream>>>(p);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess || p.splits == 1) return err;
    finalize_kernel<A><<<static_cast<unsigned>((p.rows + kWarps - 1) / kWarps), kThreads, 0, stream>>>(p);
    return cudaGetLastError();
}

// GroupNorm's map, y = (x − mean)·a + β_c with a = γ_c / √(var + ε), over plane (n, c) = blockIdx.x; tiles of
// kThreads·kUnroll vectors, blockIdx.y, grid-striding when a plane has more than 65535 tiles.
template <int V>
__global__ void __launch_bounds__(kThreads) group_norm_apply_kernel(const float* __restrict__ x, float* __restrict__ y,
                                                                    const float* __restrict__ mean,
                                                                    const float* __restrict__ var,
                                                                    const float* __restrict__ weight,
                                                                    const float* __restrict__ bias, int64_t C,
                                                                    int64_t cpg, int64_t S, float eps) {
    using VT = typename std::conditional<V == 4, float4, float>::type;
    const int64_t plane = blockIdx.x;
    const int64_t c = plane % C;
    const int64_t row = (plane / C) * (C / cpg) + c / cpg;  // (n, g)
    const float m = mean[row];
    const float a = (weight ? weight[c] : 1.f) / sqrtf(var[row] + eps);
    const float b = bias ? bias[c] : 0.f;
    const int64_t n_vec = S / V;
    const VT* __restrict__ xv = reinterpret_cast<const VT*>(x + plane * S);
    VT* __restrict__ yv = reinterpret_cast<VT*>(y + plane * S);
    const int64_t tiles = (n_vec + kThreads * kUnroll - 1) / (kThreads * kUnroll);
    for (int64_t tile = blockIdx.y; tile < tiles; tile += gridDim.y) {
        const int64_t base = tile * kThreads * kUnroll + threadIdx.x;
        VT v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int64_t i = base + u * kThreads;
            if (i < n_vec) v[u] = xv[i];
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int64_t i = base + u * kThreads;
            if (i >= n_vec) continue;
            if constexpr (V == 4) {
                yv[i] = make_float4(fmaf(v[u].x - m, a, b), fmaf(v[u].y - m, a, b), fmaf(v[u].z - m, a, b),
                                    fmaf(v[u].w - m, a, b));
            } else {
                yv[i] = fmaf(v[u] - m, a, b);
            }
        }
    }
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

}  // namespace

// Blocks per row: about one wave of blocks over all rows, each with at least kMinItemsPerSplit float4
// items (so few rows of many values still fill the GPU: N = 1 is not one block per group), and enough that
// none has more than kMaxItemsPerSplit.
int group_stats_splits(int64_t rows, int64_t L, int sm_count) {
    if (rows < 1 || L < 1) return 1;
    const int64_t items = L / 4 + 1;
    int64_t splits = (int64_t{sm_count} * kBlocksPerSM + rows - 1) / rows;
    const int64_t most = items / kMinItemsPerSplit;
    if (splits > most) splits = most;
    const int64_t least = (items + kMaxItemsPerSplit - 1) / kMaxItemsPerSplit;
    if (splits < least) splits = least;
    if (splits < 1) splits = 1;
    return splits > 65535 ? -1 : static_cast<int>(splits);  // -1: a row too long for the grid
}

// algo: 0 one-pass, 1 two-pass, 2 Welford (shifted), 3 Welford without the shift, 4 one-pass with double
// sums. partial: rows·splits·4 floats when splits > 1. Writes mean[rows] and var[rows] (biased).
cudaError_t launch_group_stats(const float* x, float* mean, float* var, float* partial, int64_t rows, int64_t L,
                               int splits, int algo, cudaStream_t stream) {
    if (rows == 0) return cudaSuccess;
    if (rows > INT_MAX || splits < 1 || splits > 65535 || L < 1) return cudaErrorInvalidValue;
    const Params p{x, mean, var, partial, rows, L, splits};
    switch (algo) {
        case 0: return launch_pass<kOnePass>(p, stream);
        case 1: {
            const cudaError_t err = launch_pass<kSum>(p, stream);
            return err != cudaSuccess ? err : launch_pass<kCentered>(p, stream);
        }
        case 2: return launch_pass<kWelford>(p, stream);
        case 3: return launch_pass<kWelfordNoShift>(p, stream);
        case 4: return launch_pass<kOnePassF64>(p, stream);
        default: return cudaErrorInvalidValue;
    }
}

// y = GroupNorm(x) from the statistics in mean/var ([N·G]): x, y (N, C, S) contiguous; weight/bias [C] or null.
cudaError_t launch_group_norm_apply(const float* x, float* y, const float* mean, const float* var, const float* weight,
                                    const float* bias, int64_t N, int64_t C, int64_t G, int64_t S, float eps,
                                    cudaStream_t stream) {
    const int64_t planes = N * C;
    if (planes == 0 || S == 0) return cudaSuccess;
    if (planes > INT_MAX || G < 1 || C % G != 0) return cudaErrorInvalidValue;
    const bool vec4 = S % 4 == 0 && aligned16(x) && aligned16(y);
    const int64_t n_vec = vec4 ? S / 4 : S;
    int64_t tiles = (n_vec + kThreads * kUnroll - 1) / (kThreads * kUnroll);
    if (tiles > 65535) tiles = 65535;  // the kernel strides over the rest
    const dim3 grid(static_cast<unsigned>(planes), static_cast<unsigned>(tiles));
    if (vec4)
        group_norm_apply_kernel<4><<<grid, kThreads, 0, stream>>>(x, y, mean, var, weight, bias, C, C / G, S, eps);
    else
        group_norm_apply_kernel<1><<<grid, kThreads, 0, stream>>>(x, y, mean, var, weight, bias, C, C / G, S, eps);
    return cudaGetLastError();
}
