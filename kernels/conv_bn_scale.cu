// conv_bn_scale.cu — P73 (Conv2d 3×3 → BatchNorm2d → ·s) fused, in training and eval mode. NCHW float32,
// stride 1, no padding. The convolution below is plain FFMA (no TF32); the eval mode and the moments strategy
// can instead write their output with a 3xTF32 tensor-core convolution (argument math) — Hopper's warpgroup MMA
// (conv_wgmma.cuh) where it runs, mma.sync (conv_tf32.cuh) elsewhere, with the same arithmetic and results —
// and the moments strategy then also forms its sums on the tensor cores.
//
// One direct-convolution kernel, compiled twice (template kStats):
//   eval  (kStats = false): y = conv(x, W') + b' with W', b' folded from the eval-mode BN and s
//                           (kernelbook/folding.py): the whole of eval-mode P73 in one launch.
//   train (kStats = true):  y = conv(x, W) + b is written once, and the epilogue also summarises each
//                           output channel, less a per-channel pivot near its mean (pivots_kernel), as a
//                           Welford state (count, mean, M2): per thread across its
//                           tiles (Chan's merge, one count shared by all its channels), across the warp by
//                           shuffles, one partial state per (block, warp row) in global memory; the last
//                           block to finish merges them in double, writes the per-channel map
//                           y ← (y − mean)·γs/√(var + ε) + βs and updates the running statistics exactly
//                           as nn.BatchNorm2d does. Then an in-place apply kernel normalises y (chapter 1's
//                           finalize, apply arithmetic and grid, shared through bn_stats.cuh, not copied; chapter
//                           1's apply kernel is not used with x == y: it reads through const __restrict__ pointers).
// Training mode therefore moves the output three times (write, read, write: 3 × 520 MB for P73) against
// computing the convolution twice (chapter 3 counts both). The default training strategy
// avoids both: conv_moments.cuh computes the batch statistics from the input's moments (no convolution, no
// output), folds them into the weights, and the eval kernel writes the output once (launch_cbs_train_moments).
//
// The convolution is chapter 2's tiled kernel (conv2d_folded.cu) taken further:
//   * RPT output rows per thread (default 2): each staged input row and each weight loaded from shared
//     memory feeds RPT times as many FMAs; per-tile costs (staging, tile indexing) are paid per RPT rows;
//   * double-buffered input staging when all input channels fit one chunk (P73: 8): the next tile's rows
//     are copied while this one is computed — with cp.async on sm_80+ when KB_CBS_ASYNC=1, otherwise with
//     ordinary loads issued before the compute.
// A block computes WROWS·RPT output rows × 128 columns × CO_T·GROUPS channels of one image; warp (g, r)
// owns rows r·RPT … r·RPT+RPT−1 and channels CO_T·g …; lane l owns columns 2l, 2l+1, 64+2l, 65+2l.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "bn_stats.cuh"      // chapter 1's finalize, running-statistics update, apply map and grid (shared)
#include "conv_bn_scale.h"
#include "conv_moments.cuh"  // training statistics from the input's moments
#include "conv_tf32.cuh"     // the 3xTF32 tensor-core convolution by mma.sync (sm_80+)
#include "conv_wgmma.cuh"    // the same by wgmma (sm_90a)
#include "welford.cuh"

#ifndef KB_CBS_RPT
#define KB_CBS_RPT 2
#endif
#ifndef KB_CBS_CO_T
#define KB_CBS_CO_T 8
#endif
#ifndef KB_CBS_GROUPS
#define KB_CBS_GROUPS 8
#endif
#ifndef KB_CBS_WROWS
#define KB_CBS_WROWS 1
#endif
#ifndef KB_CBS_MIN_BLOCKS
#define KB_CBS_MIN_BLOCKS 2
#endif
#ifndef KB_CBS_ASYNC
#define KB_CBS_ASYNC 1
#endif

namespace cbs {

constexpr int K3 = 3;
constexpr int PAIRS = 2;                          // column pairs per lane
constexpr int TILE_W = 2 * 32 * PAIRS;            // 128 output columns per warp
constexpr int RPT = KB_CBS_RPT;                   // output rows per thread
constexpr int WROWS = KB_CBS_WROWS;               // warps along the rows
constexpr int CO_T = KB_CBS_CO_T;                 // output channels per thread (a multiple of 4)
constexpr int GROUPS = KB_CBS_GROUPS;             // warps along the channels
constexpr int CO_B = CO_T * GROUPS;
constexpr int TILE_H = RPT * WROWS;               // output rows per tile
constexpr int CI_CHUNK = 8;                       // input channels staged at a time
constexpr int IN_ROWS = TILE_H + K3 - 1;
constexpr int IN_W = TILE_W + K3 - 1;             // 130 input columns feed 128 output columns
constexpr int IN_PITCH = TILE_W + 4;              // 132: keeps float2 reads 8-byte aligned
constexpr int THREADS = 32 * WROWS * GROUPS;
constexpr int IN_BUF = CI_CHUNK * IN_ROWS * IN_PITCH;     // floats per input buffer
constexpr int W_FLOATS = CI_CHUNK * K3 * K3 * CO_B;
constexpr int SMEM_BYTES = (2 * IN_BUF + W_FLOATS) * 4;   // two input buffers, then the weights
constexpr int STATS_BYTES = THREADS * CO_T * 8;           // training mode: then (mean, M2) per thread and channel
template <bool kStats>
constexpr int smem_bytes() { return SMEM_BYTES + (kStats ? STATS_BYTES : 0); }
static_assert(CO_T % 4 == 0, "weights are read as float4: CO_T must be a multiple of 4");
static_assert(THREADS <= 1024, "at most 1024 threads per block");

struct Shape {
    int N, C_in, H, W, C_out, HO, WO;
    int row_tiles, col_tiles, groups;
    int n_tiles;
    bool y_even;  // y's base address is 8-byte aligned: float2 stores are legal where the offset is even
};

// Training-mode extras: where the partial states go and what the last block does with them.
struct Stats {
    kb::Welford<float>* partial;   // [C_out][slots], slot = block·WROWS + warp row
    unsigned* arrivals;            // one counter, zeroed by the caller
    float* mab;                    // [6·C_out]: m_hi, m_lo, a, b of y ← ((y − m_hi) − m_lo)·a + b, then
                                   // the pivots (pivots_kernel), which the states are summed about
    const float* gamma;            // or null (γ = 1)
    const float* beta;             // or null (β = 0)
    float* running_mean;           // or null (no running statistics)
    float* running_var;
    const int64_t* num_batches_tracked;  // read for momentum None; bn_train's apply kernel increments it
    float momentum;                // < 0: cumulative average (momentum None)
    float eps, scale;
    const unsigned* guard;         // "auto": run only when *guard == run_if (conv_moments.cuh); null: always run
    unsigned run_if;
    bool y_less_pivot;             // y holds the outputs less their channel's pivot (the FFMA convolution)
    const float* bias;             // the convolution's bias, or null
    float* pivots;                 // [2·C_out] (in mab's last rows): start = −(the filter on the input's pivots),
                                   // then the pivots P = b − start, rounded (pivots_kernel)
};

struct Tile {
    int64_t n;
    int cb, oh0, ow0;
};

__device__ __forceinline__ Tile tile_coords(int tile, const Shape& s) {
    int t = tile;
    Tile c;
    const int ct = t % s.col_tiles;
    t /= s.col_tiles;
    const int rt = t % s.row_tiles;
    t /= s.row_tiles;
    c.n = t % s.N;
    c.cb = t / s.N;
    c.oh0 = rt * TILE_H;
    c.ow0 = ct * TILE_W;
    return c;
}

__device__ __forceinline__ void copy_f32(float* dst, const float* src, bool ok) {
#if KB_CBS_ASYNC && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    // 4-byte asynchronous copy; src-size 0 writes a zero without reading (src must still be a valid address).
    const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(ok ? 4 : 0));
#else
    *dst = ok ? *src : 0.0f;
#endif
}

__device__ __forceinline__ void async_commit() {
#if KB_CBS_ASYNC && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Wait until at most `pending` of this thread's committed copy groups are still in flight.
template <int pending>
__device__ __forceinline__ void async_wait() {
#if KB_CBS_ASYNC && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(pending));
#endif
}

// Stage input rows oh0 … oh0+IN_ROWS−1, columns ow0 … ow0+IN_W−1 of channels ci0 … ci0+nci−1, one row per
// warp at a time, lanes along the row (coalesced); zeros outside the image feed only outputs never stored.
__device__ __forceinline__ void stage_input(float* in, const float* __restrict__ x, const Shape& s, const Tile& t,
                                            int ci0, int nci, int warp, int lane, int n_warps) {
    for (int cr = warp; cr < CI_CHUNK * IN_ROWS; cr += n_warps) {
        const int c = cr / IN_ROWS, row = cr % IN_ROWS, ih = t.oh0 + row;
        const bool row_ok = c < nci && ih < s.H;
        const float* xrow =
            row_ok ? x + ((t.n * s.C_in + ci0 + c) * s.H + ih) * static_cast<int64_t>(s.W) + t.ow0 : x;
        float* dst = in + (c * IN_ROWS + row) * IN_PITCH;
        for (int col = lane; col < IN_W; col += 32) {
            const bool ok = row_ok && t.ow0 + col < s.W;
            copy_f32(dst + col, ok ? xrow + col : x, ok);
        }
    }
}

// w_s[c][k][co] = W[co0+co][ci0+c][k]; zeros for missing channels (their outputs are never stored).
__device__ __forceinline__ void stage_weights(float* w_s, const float* __restrict__ w, const Shape& s, int co0,
                                              int ci0, int nci, int n_threads) {
    const int co_b = CO_T * s.groups;
    for (int i = threadIdx.x; i < CI_CHUNK * K3 * K3 * co_b; i += n_threads) {
        const int co = i % co_b, k = (i / co_b) % (K3 * K3), c = i / (co_b * K3 * K3);
        float v = 0.0f;
        if (c < nci && co0 + co < s.C_out) v = w[((static_cast<int64_t>(co0 + co) * s.C_in + ci0 + c) * K3 * K3) + k];
        w_s[(c * K3 * K3 + k) * CO_B + co] = v;
    }
}

// acc[rr][c][j] += Σ over the staged channels of the 3×3 window (rows r0+rr …, columns 2·lane+64p …).
// excerpt: compute
__device__ __forceinline__ void compute(float (&acc)[RPT][CO_T][2 * PAIRS], const float* in, const float* w_s, int nci,
                                        int r0, int g, int lane) {
#pragma unroll 1
    for (int c = 0; c < nci; ++c) {
        const float* in_c = in + c * IN_ROWS * IN_PITCH;
        const float* w_c = w_s + c * K3 * K3 * CO_B + CO_T * g;
#pragma unroll
        for (int kh = 0; kh < K3; ++kh) {
            float v[RPT][PAIRS][4];
#pragma unroll
            for (int rr = 0; rr < RPT; ++rr)
#pragma unroll
                for (int p = 0; p < PAIRS; ++p) {
                    const float* row = in_c + (r0 + rr + kh) * IN_PITCH + 2 * lane + 64 * p;
                    const float2 a = *reinterpret_cast<const float2*>(row);
                    const float2 d = *reinterpret_cast<const float2*>(row + 2);
                    v[rr][p][0] = a.x; v[rr][p][1] = a.y; v[rr][p][2] = d.x; v[rr][p][3] = d.y;
                }
#pragma unroll
            for (int kw = 0; kw < K3; ++kw) {
                const float4* wp = reinterpret_cast<const float4*>(w_c + (kh * K3 + kw) * CO_B);
#pragma unroll
                for (int q = 0; q < CO_T / 4; ++q) {
                    const float4 w4 = wp[q];
                    const float wq[4] = {w4.x, w4.y, w4.z, w4.w};
#pragma unroll
                    for (int e = 0; e < 4; ++e)
#pragma unroll
                        for (int rr = 0; rr < RPT; ++rr)
#pragma unroll
                            for (int p = 0; p < PAIRS; ++p)
#pragma unroll
                                for (int j = 0; j < 2; ++j)
                                    acc[rr][4 * q + e][2 * p + j] =
                                        fmaf(v[rr][p][j + kw], wq[e], acc[rr][4 * q + e][2 * p + j]);
                }
            }
        }
    }
}
// end excerpt: compute

// Input channel ch's median over the moments' 4×4 grid of sample 0 (the mean of the 8th and 9th of the 16 values):
// near the bulk of the channel's values even when up to 7 of the 16 are outliers (one far-off pixel at a grid point
// moves the moments' mean of the 16, cbm::pivot, by a sixteenth of its size, and this not at all).
__device__ __forceinline__ float median_pivot(const float* __restrict__ x, int H, int W, int ch) {
    const float* plane = x + static_cast<int64_t>(ch) * H * W;
    float v[16];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
            v[4 * i + j] = __ldg(plane + static_cast<int64_t>(i * (H - 1) / 3) * W + j * (W - 1) / 3);
#pragma unroll
    for (int pass = 0; pass < 16; ++pass)  // odd–even transposition sort: 16 passes sort 16 values
#pragma unroll
        for (int k = pass & 1; k + 1 < 16; k += 2) {
            const float lo = fminf(v[k], v[k + 1]), hi = fmaxf(v[k], v[k + 1]);
            v[k] = lo;
            v[k + 1] = hi;
        }
    return 0.5f * (v[7] + v[8]);
}

// The in-place statistics' pivots, before the convolution: channel co's is P_co = b_co + Σ_i p_i·Σ_taps w[co, i, tap],
// the filter applied to the input channels' medians p_i (median_pivot) — near the channel's mean wherever each
// input channel's mean is near its median. Welford's mean drifts by about u·|mean − pivot|, not u·|mean|, so a
// channel whose mean dwarfs its spread keeps its digits.
// st.pivots[co] = start_co = −Σ_i p_i·Σ_taps w[co, i, tap]: the FFMA convolution's accumulators start there (the
// training launch passes it in the bias's place), so they hold y − P, the filter applied to the pivot-shifted input,
// at no cost in registers; st.pivots[C_out + co] = P_co rounded, what the statistics pass of the tensor-core path
// subtracts and what the running mean adds back. A warp per channel. With a guard, only when *guard == run_if.
constexpr int P_THREADS = 256;

__global__ void __launch_bounds__(P_THREADS) pivots_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                                           Shape s, Stats st) {
    if (st.guard != nullptr && *st.guard != st.run_if) return;
    const int co = blockIdx.x * (P_THREADS / 32) + threadIdx.x / 32;
    if (co >= s.C_out) return;  // warp-uniform
    float q = 0.f;
    for (int i = threadIdx.x & 31; i < s.C_in; i += 32) {
        const float* wi = w + (static_cast<int64_t>(co) * s.C_in + i) * K3 * K3;
        float taps = 0.f;
#pragma unroll
        for (int k = 0; k < K3 * K3; ++k) taps += __ldg(wi + k);
        q = fmaf(median_pivot(x, s.H, s.W, i), taps, q);
    }
    for (int o = 16; o > 0; o >>= 1) q += __shfl_xor_sync(0xffffffffu, q, o);
    if ((threadIdx.x & 31) == 0) {
        st.pivots[co] = -q;
        st.pivots[s.C_out + co] = (st.bias != nullptr ? __ldg(st.bias + co) : 0.0f) + q;  // P, rounded
    }
}

// Channel c's pivot P_c as a float: what the tensor-core path's statistics pass subtracts, and what the running mean
// adds back on either path (the FFMA path's own b − start differs by at most u·|P|/2, below the running mean's
// float32 rounding).
__device__ __forceinline__ float pivot_f32(const Stats& st, int C_out, int c) { return __ldcg(st.pivots + C_out + c); }

// One thread's running statistics: a Welford state per channel, all with the same count n (a register).
// The (mean, M2) pairs live in shared memory, [channel][thread] as float2 (consecutive threads, consecutive
// 8-byte words: no bank conflicts), because 2·CO_T more registers would make the kernel spill.
struct ThreadStats {
    float n;
    float2* mm;  // &stat_s[0][threadIdx.x]; channel c at mm[c * blockDim.x]
};

// Merge this tile's valid outputs into the thread's states (Chan's formula; the count and the merge weights are
// shared by all CO_T channels) as acc holds them in training mode: less each channel's pivot. Invalid positions
// (past the right or bottom edge) are masked out.
__device__ __forceinline__ void accumulate_stats(ThreadStats& ts, const float (&acc)[RPT][CO_T][2 * PAIRS],
                                                 const Shape& s, int oh_first, int col0) {
    float mask[RPT][2 * PAIRS];
    float k = 0.0f;
#pragma unroll
    for (int rr = 0; rr < RPT; ++rr)
#pragma unroll
        for (int p = 0; p < PAIRS; ++p)
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const bool ok = oh_first + rr < s.HO && col0 + 64 * p + j < s.WO;
                mask[rr][2 * p + j] = ok ? 1.0f : 0.0f;
                k += mask[rr][2 * p + j];
            }
    if (k == 0.0f) return;
    const float inv_k = 1.0f / k;
    const float n = ts.n + k;
    const float wb = k / n;          // weight of the new values in the merged mean
    const float f = ts.n * wb;       // na·nb/n
    ts.n = n;
#pragma unroll
    for (int c = 0; c < CO_T; ++c) {
        float sum = 0.0f;
#pragma unroll
        for (int rr = 0; rr < RPT; ++rr)
#pragma unroll
            for (int j = 0; j < 2 * PAIRS; ++j) sum = fmaf(acc[rr][c][j], mask[rr][j], sum);
        const float mb = sum * inv_k;
        float m2b = 0.0f;
#pragma unroll
        for (int rr = 0; rr < RPT; ++rr)
#pragma unroll
            for (int j = 0; j < 2 * PAIRS; ++j) {
                const float d = acc[rr][c][j] - mb;
                m2b = fmaf(d * mask[rr][j], d, m2b);
            }
        float2 a = ts.mm[c * blockDim.x];
        const float delta = mb - a.x;
        a.x = fmaf(delta, wb, a.x);
        a.y += fmaf(delta * delta, f, m2b);
        ts.mm[c * blockDim.x] = a;
    }
}

// Warp-merge the threads' states and write one partial state per channel; reset the thread's states.
// Every lane of the warp calls it (full-mask shuffles); the call is block-uniform.
__device__ __forceinline__ void flush_stats(ThreadStats& ts, const Stats& st, const Shape& s, int co_first, int slot,
                                            int slots, int lane) {
#pragma unroll
    for (int c = 0; c < CO_T; ++c) {
        const float2 a = ts.mm[c * blockDim.x];
        kb::Welford<float> w{ts.n, a.x, a.y};
        w = kb::welford_warp_reduce(w);
        if (lane == 0 && co_first + c < s.C_out) st.partial[static_cast<int64_t>(co_first + c) * slots + slot] = w;
        ts.mm[c * blockDim.x] = make_float2(0.0f, 0.0f);
    }
    ts.n = 0.0f;
}

// The last block: merge each channel's partial states (about its pivot q) in double; update the running statistics
// with the outputs' mean, m + q, and write the map (m, a, b) for the values y holds: less q when the FFMA
// convolution wrote them (st.y_less_pivot), the outputs themselves otherwise.
__device__ void finish_stats(const Stats& st, const Shape& s, int slots) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    for (int c = warp; c < s.C_out; c += n_warps) {
        const double q = pivot_f32(st, s.C_out, c);  // the states are about the pivot: their means, plus q
        kb::Welford<double> tot{0.0, 0.0, 0.0};
        for (int i = lane; i < slots; i += 32) {
            const kb::Welford<float>* p = st.partial + static_cast<int64_t>(c) * slots + i;
            const kb::Welford<double> b{__ldcg(&p->n), __ldcg(&p->mean) + q, __ldcg(&p->m2)};
            kb::welford_merge(tot, b);
        }
        tot = kb::welford_warp_reduce(tot);
        if (lane != 0) continue;
        kb::bn_finish_channel(tot, c, s.C_out, st.mab, st.gamma, st.beta, st.running_mean, st.running_var,
                              st.num_batches_tracked, st.momentum, st.eps, st.scale);  // bn_stats.cuh
        if (st.y_less_pivot) {  // y holds the outputs less the pivot: so does the map's mean
            const double m = tot.mean - q;
            const float m_hi = static_cast<float>(m);
            st.mab[c] = m_hi;
            st.mab[s.C_out + c] = static_cast<float>(m - static_cast<double>(m_hi));
        }
    }
}

// After a block wrote its partial states: count it in, and the last block of the grid to arrive merges every
// channel's states (finish_stats). Block-uniform; every thread of the block calls it.
__device__ __forceinline__ void last_block_finishes(const Stats& st, const Shape& s, int slots) {
    __shared__ bool last;
    __threadfence();  // publish this block's partial states before announcing them
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(st.arrivals, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    finish_stats(st, s, slots);
}

template <bool kStats, bool kPipe>
__global__ void __launch_bounds__(THREADS, KB_CBS_MIN_BLOCKS)
conv3x3_kernel(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
               float* __restrict__ y, Shape s, Stats st) {
    // "auto": the fold kernel's flag picks one path; the other path's launches end here (block-uniform, before
    // any barrier or store).
    if (st.guard != nullptr && *st.guard != st.run_if) return;
    extern __shared__ __align__(16) float smem[];
    float* w_s = smem + 2 * IN_BUF;

    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int r = warp % WROWS;
    const int g = warp / WROWS;
    const int n_warps = WROWS * s.groups;
    const int n_threads = 32 * n_warps;
    const int co_b = CO_T * s.groups;
    const int slots = gridDim.x * WROWS;
    const int slot = blockIdx.x * WROWS + r;
    int resident_cb = -1;

    ThreadStats ts{0.0f, reinterpret_cast<float2*>(w_s + W_FLOATS) + threadIdx.x};
    if (kStats) {
#pragma unroll
        for (int c = 0; c < CO_T; ++c) ts.mm[c * blockDim.x] = make_float2(0.0f, 0.0f);
        // Empty states in this block's slots for every channel: a channel block this block never visits
        // leaves them empty. Ordered before the flushes by the __syncthreads of the tile loop.
        for (int i = threadIdx.x; i < s.C_out * WROWS; i += n_threads)
            st.partial[static_cast<int64_t>(i / WROWS) * slots + blockIdx.x * WROWS + i % WROWS] =
                kb::Welford<float>{0.f, 0.f, 0.f};
    }

    // kPipe (all input channels in one chunk): tile t+1's rows are staged into the other buffer while t is
    // computed. Tile order: channel block slowest, so consecutive tiles of a block share their weights.
    int buf = 0;
    if (kPipe && blockIdx.x < s.n_tiles) {
        stage_input(smem, x, s, tile_coords(blockIdx.x, s), 0, s.C_in, warp, lane, n_warps);
        async_commit();
    }
    for (int tile = blockIdx.x; tile < s.n_tiles; tile += gridDim.x) {
        const Tile t = tile_coords(tile, s);
        const int co0 = t.cb * co_b;
        if (kStats && resident_cb >= 0 && resident_cb != t.cb)
            flush_stats(ts, st, s, resident_cb * co_b + CO_T * g, slot, slots, lane);

        float acc[RPT][CO_T][2 * PAIRS];
#pragma unroll
        for (int c = 0; c < CO_T; ++c) {
            const int co = co0 + CO_T * g + c;
            const float bias = b != nullptr && co < s.C_out ? b[co] : 0.0f;
#pragma unroll
            for (int rr = 0; rr < RPT; ++rr)
#pragma unroll
                for (int j = 0; j < 2 * PAIRS; ++j) acc[rr][c][j] = bias;
        }

        if (kPipe) {
            const int next = tile + gridDim.x;
            if (next < s.n_tiles)
                stage_input(smem + (buf ^ 1) * IN_BUF, x, s, tile_coords(next, s), 0, s.C_in, warp, lane, n_warps);
            async_commit();
            if (resident_cb != t.cb) {
                stage_weights(w_s, w, s, co0, 0, s.C_in, n_threads);
                resident_cb = t.cb;
            }
            async_wait<1>();  // this tile's copies (all but the group just committed) have landed
            __syncthreads();
            compute(acc, smem + buf * IN_BUF, w_s, s.C_in, r * RPT, g, lane);
            __syncthreads();  // before the next iteration stages into this buffer
            buf ^= 1;
        } else {
            for (int ci0 = 0; ci0 < s.C_in; ci0 += CI_CHUNK) {
                const int nci = min(CI_CHUNK, s.C_in - ci0);
                stage_input(smem, x, s, t, ci0, nci, warp, lane, n_warps);
                async_commit();
                if (s.C_in > CI_CHUNK || resident_cb != t.cb) {
                    stage_weights(w_s, w, s, co0, ci0, nci, n_threads);
                    resident_cb = t.cb;
                }
                async_wait<0>();
                __syncthreads();
                compute(acc, smem, w_s, nci, r * RPT, g, lane);
                __syncthreads();  // before the next chunk or tile overwrites the staged input
            }
        }

        // Epilogue: float2 stores where every row starts 8-byte aligned (y aligned and WO even: P73),
        // single floats otherwise and at the edges. A warp's float2 stores cover 256 contiguous bytes.
        const int oh_first = t.oh0 + r * RPT;
        const int col0 = t.ow0 + 2 * lane;
        const int64_t plane = static_cast<int64_t>(s.HO) * s.WO;
        const bool pairs_ok = s.y_even && (s.WO & 1) == 0;
#pragma unroll
        for (int rr = 0; rr < RPT; ++rr) {
            const int oh = oh_first + rr;
            if (oh >= s.HO) break;
            float* yrow = y + ((t.n * s.C_out + co0 + CO_T * g) * s.HO + oh) * static_cast<int64_t>(s.WO);
#pragma unroll
            for (int c = 0; c < CO_T; ++c, yrow += plane) {
                if (co0 + CO_T * g + c >= s.C_out) break;
#pragma unroll
                for (int p = 0; p < PAIRS; ++p) {
                    const int col = col0 + 64 * p;
                    if (pairs_ok && col + 1 < s.WO) {
                        *reinterpret_cast<float2*>(yrow + col) = make_float2(acc[rr][c][2 * p], acc[rr][c][2 * p + 1]);
                    } else {
                        if (col < s.WO) yrow[col] = acc[rr][c][2 * p];
                        if (col + 1 < s.WO) yrow[col + 1] = acc[rr][c][2 * p + 1];
                    }
                }
            }
        }
        if (kStats) accumulate_stats(ts, acc, s, oh_first, col0);
    }

    if (!kStats) return;
    if (resident_cb >= 0) flush_stats(ts, st, s, resident_cb * co_b + CO_T * g, slot, slots, lane);
    last_block_finishes(st, s, slots);
}

// Persistent grid: as many blocks as fit on the GPU at once (asked once per device and kernel), after opting
// the kernel in to its dynamic shared memory. `static` matters: a static local of a function template with
// external linkage is an STB_GNU_UNIQUE symbol, which the dynamic linker shares between every loaded module
// (even RTLD_LOCAL ones): a second build variant (or the generated solution) in the same process would find
// the cache filled by the first and launch its own kernel without the shared-memory opt-in.
template <bool kStats, bool kPipe>
static cudaError_t resident_blocks(int groups, int* out) {
    static int cache[64][GROUPS + 1] = {};
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) return err;
    int& blocks = cache[device % 64][groups];
    if (blocks == 0) {
        err = cudaFuncSetAttribute(conv3x3_kernel<kStats, kPipe>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   smem_bytes<kStats>());
        int sms = 0, per_sm = 0;
        if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
        if (err == cudaSuccess)
            err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, conv3x3_kernel<kStats, kPipe>,
                                                                32 * WROWS * groups, smem_bytes<kStats>());
        if (err != cudaSuccess) return err;
        blocks = sms * (per_sm > 0 ? per_sm : 1);
    }
    *out = blocks;
    return cudaSuccess;
}

Shape make_shape(int64_t N, int C_in, int H, int W, int C_out, const float* y) {
    Shape s;
    s.N = static_cast<int>(N); s.C_in = C_in; s.H = H; s.W = W; s.C_out = C_out;
    s.HO = H - K3 + 1; s.WO = W - K3 + 1;
    s.groups = (C_out + CO_T - 1) / CO_T < GROUPS ? (C_out + CO_T - 1) / CO_T : GROUPS;
    s.row_tiles = (s.HO + TILE_H - 1) / TILE_H;
    s.col_tiles = (s.WO + TILE_W - 1) / TILE_W;
    s.n_tiles = 0;
    s.y_even = (reinterpret_cast<uintptr_t>(y) & 7) == 0;
    return s;
}

template <bool kStats>
cudaError_t launch(const float* x, const float* w, const float* b, float* y, Shape s, const Stats& st, int grid,
                   cudaStream_t stream) {
    const dim3 block(32 * WROWS * s.groups);
    if (s.C_in <= CI_CHUNK)
        conv3x3_kernel<kStats, true><<<grid, block, smem_bytes<kStats>(), stream>>>(x, w, b, y, s, st);
    else
        conv3x3_kernel<kStats, false><<<grid, block, smem_bytes<kStats>(), stream>>>(x, w, b, y, s, st);
    return cudaGetLastError();
}

// y ← ((y − m_hi[c]) − m_lo[c])·a[c] + b[c] in place over chapter 1's apply work items (bn_stats.cuh's grid),
// (plane (n, c), tile) = item / tiles, item % tiles, walked by a grid of at most kApplyBlocksPerSM blocks per
// SM (so that a launch the guard turns away costs a few hundred empty blocks, not one per item), and the batch
// counted (num_batches_tracked += 1, after the conv kernel's last block read it: stream order).
// bn_train's bn_apply_kernel with x == y would be undefined behaviour: it reads through a const __restrict__
// pointer, which nvcc compiles to ld.global.nc (the data must be read-only for the kernel's whole lifetime)
// while the same kernel writes it. Here one pointer, not __restrict__, is read and then written.
constexpr int kApplyBlocksPerSM = 8;  // 8 × 256 threads: a full SM
constexpr int kThreads = kb::kBnThreads;
constexpr int kUnroll = kb::kBnUnroll;
using kb::normalise;
using kb::Vec;

// What the in-place apply reads and writes: y (N·C planes of HW floats) and the map, mab's first 4·C floats
// (bn_stats.cuh).
struct Apply {
    float* y;
    const float* mab;
    int64_t* num_batches_tracked;  // or null; counted here
    int64_t N, C, HW;
};

template <int V>
__global__ void __launch_bounds__(kThreads) apply_inplace_kernel(Apply p, int64_t items, int64_t tiles,
                                                                 const unsigned* guard) {
    if (guard != nullptr && *guard != 1u) return;  // "auto" chose the moments
    using VT = typename Vec<V>::T;
    if (blockIdx.x == 0 && threadIdx.x == 0 && p.num_batches_tracked) *p.num_batches_tracked += 1;
    const int64_t items_per_plane = p.HW / V;
    for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
        const int64_t plane = item / tiles;
        const int c = static_cast<int>(plane % p.C);
        const kb::BnApply map = kb::bn_apply_of(p.mab, p.C, c);
        VT* y = reinterpret_cast<VT*>(p.y) + plane * items_per_plane;
        const int64_t base = (item % tiles) * kThreads * kUnroll + threadIdx.x;
        VT v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {  // all loads first (kUnroll in flight), then the stores
            const int64_t i = base + u * kThreads;
            if (i < items_per_plane) v[u] = y[i];
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int64_t i = base + u * kThreads;
            if (i < items_per_plane) y[i] = normalise(v[u], map);
        }
    }
}

// guard: null, or run only when *guard == 1 ("auto" chose the in-place path).
cudaError_t launch_apply_inplace(const Apply& p, const unsigned* guard, cudaStream_t stream) {
    const bool vec4 = kb::bn_vec4(p.y, p.y, p.HW);
    dim3 grid;
    if (!kb::bn_apply_grid(p.N, p.C, p.HW, vec4 ? 4 : 1, &grid)) return cudaErrorInvalidValue;
    int device = 0, sms = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (err != cudaSuccess) return err;
    const int64_t tiles = grid.y, items = static_cast<int64_t>(grid.x) * grid.y;
    const int64_t cap = static_cast<int64_t>(sms > 0 ? sms : 1) * kApplyBlocksPerSM;
    const unsigned blocks = static_cast<unsigned>(items < cap ? items : cap);
    if (vec4)
        apply_inplace_kernel<4><<<blocks, kThreads, 0, stream>>>(p, items, tiles, guard);
    else
        apply_inplace_kernel<1><<<blocks, kThreads, 0, stream>>>(p, items, tiles, guard);
    return cudaGetLastError();
}

}  // namespace cbs

int cbs_tf32_max_channels() { return cbt::CI; }

// The kernels' filter size (the binding names it when given another).
int cbs_kernel_size() { return cbs::K3; }

// The largest output plane (HO·WO floats) the in-place apply's grid covers.
int64_t cbs_max_plane() { return kb::bn_apply_max_plane(); }

// Tiles of the output; the binding checks the count fits 31 bits.
int64_t cbs_tiles(int64_t N, int H, int W, int C_out) {
    using namespace cbs;
    const int64_t ho = H - K3 + 1, wo = W - K3 + 1;
    if (N <= 0 || C_out <= 0 || ho <= 0 || wo <= 0) return 0;
    const int64_t groups = (C_out + CO_T - 1) / CO_T < GROUPS ? (C_out + CO_T - 1) / CO_T : GROUPS;
    return N * ((ho + TILE_H - 1) / TILE_H) * ((wo + TILE_W - 1) / TILE_W) *
           ((C_out + CO_T * groups - 1) / (CO_T * groups));
}

// The grid the training launch will use, and so the number of partial-state slots per channel
// (grid · WROWS): the binding allocates C_out · slots states. Returns 0 for an empty output.
cudaError_t cbs_train_slots(int64_t N, int C_in, int H, int W, int C_out, int64_t* slots) {
    *slots = 0;
    const int64_t tiles = cbs_tiles(N, H, W, C_out);
    if (tiles == 0) return cudaSuccess;
    const int groups = (C_out + cbs::CO_T - 1) / cbs::CO_T < cbs::GROUPS ? (C_out + cbs::CO_T - 1) / cbs::CO_T
                                                                         : cbs::GROUPS;
    int blocks = 0;
    const cudaError_t err = C_in <= cbs::CI_CHUNK ? cbs::resident_blocks<true, true>(groups, &blocks)
                                                  : cbs::resident_blocks<true, false>(groups, &blocks);
    if (err != cudaSuccess) return err;
    *slots = (tiles < blocks ? tiles : blocks) * static_cast<int64_t>(cbs::WROWS);
    return cudaSuccess;
}

// The compile-time configuration, for records and for the binding's `config()`.
void cbs_config(int* out) {
    out[0] = cbs::RPT; out[1] = cbs::CO_T; out[2] = cbs::GROUPS; out[3] = cbs::WROWS; out[4] = KB_CBS_MIN_BLOCKS;
    out[5] = KB_CBS_ASYNC; out[6] = cbs::smem_bytes<false>(); out[7] = cbs::smem_bytes<true>();
}

namespace cbs {

// The tensor-core convolution's instruction: wgmma where cbw::available, unless mma.sync is asked for
// (cbs_set_tc_mma_sync: for comparisons; both give bitwise the same output).
static int g_tc_mma_sync = 0;

cudaError_t tc_uses_wgmma(bool* out) {
    if (g_tc_mma_sync) {
        *out = false;
        return cudaSuccess;
    }
    return cbw::available(out);
}

cudaError_t tc_conv(const float* x, const float* w, const float* b, float* y, int64_t N, int C_in, int H, int W,
                    int C_out, const unsigned* guard, unsigned run_if, cudaStream_t stream) {
    bool wgmma = false;
    const cudaError_t err = tc_uses_wgmma(&wgmma);
    if (err != cudaSuccess) return err;
    return wgmma ? cbw::conv(x, w, b, y, N, C_in, H, W, C_out, guard, run_if, stream)
                 : cbt::conv(x, w, b, y, N, C_in, H, W, C_out, guard, run_if, stream);
}

// Eval mode: y = conv(x, w) + b, by FFMA or on the tensor cores (math); with a guard, only when *guard == run_if
// ("auto" chose the moments with this convolution: cbm::FLAG_MOMENTS or FLAG_MOMENTS_FFMA_CONV).
cudaError_t eval(const float* x, const float* w, const float* b, float* y, int64_t N, int C_in, int H, int W,
                 int C_out, const unsigned* guard, int math, cudaStream_t stream, unsigned run_if = cbm::FLAG_MOMENTS) {
    if (math == kCbs3xTf32) return tc_conv(x, w, b, y, N, C_in, H, W, C_out, guard, run_if, stream);
    if (math != kCbsFp32) return cudaErrorInvalidValue;
    const int64_t tiles = cbs_tiles(N, H, W, C_out);
    if (tiles == 0) return cudaSuccess;
    if (tiles > INT_MAX) return cudaErrorInvalidValue;
    Shape s = make_shape(N, C_in, H, W, C_out, y);
    s.n_tiles = static_cast<int>(tiles);
    int blocks = 0;
    const cudaError_t err = C_in <= CI_CHUNK ? resident_blocks<false, true>(s.groups, &blocks)
                                             : resident_blocks<false, false>(s.groups, &blocks);
    if (err != cudaSuccess) return err;
    Stats st{};
    st.guard = guard;
    st.run_if = run_if;
    return launch<false>(x, w, b, y, s, st, s.n_tiles < blocks ? s.n_tiles : blocks, stream);
}

// The in-place strategy's checks, done before anything is launched (never update the stats and then fail).
bool inplace_ok(int64_t N, int H, int W, int C_out, int64_t slots, float* y) {
    const int64_t tiles = cbs_tiles(N, H, W, C_out);
    if (tiles > INT_MAX || slots <= 0 || slots % WROWS != 0 || slots / WROWS > tiles) return false;
    const int64_t HW = static_cast<int64_t>(H - K3 + 1) * (W - K3 + 1);
    dim3 grid;
    return kb::bn_apply_grid(N, C_out, HW, kb::bn_vec4(y, y, HW) ? 4 : 1, &grid);
}

// The in-place strategy's statistics when its convolution ran on the tensor cores (whose epilogue keeps no
// statistics: its registers are full): block (c, part) reads part `part` of channel c's N·HO·WO outputs — whole
// planes' ranges, coalesced — into per-thread Welford states, merges them in the block and writes one partial
// state; the last block merges them all in double (finish_stats). One more read of y than the FFMA epilogue.
constexpr int S_THREADS = 256;

__global__ void __launch_bounds__(S_THREADS) channel_stats_kernel(const float* __restrict__ y, Shape s, Stats st,
                                                                  int parts) {
    if (st.guard != nullptr && *st.guard != st.run_if) return;  // block-uniform
    __shared__ kb::Welford<float> scratch[S_THREADS / 32];
    const int c = blockIdx.x / parts, part = blockIdx.x % parts;
    const int64_t hw = static_cast<int64_t>(s.HO) * s.WO, total = s.N * hw;
    const int64_t begin = total * part / parts, end = total * (part + 1) / parts;
    const float piv = pivot_f32(st, s.C_out, c);  // statistics about the channel's pivot
    kb::Welford<float> w{0.f, 0.f, 0.f};
    for (int64_t n = begin / hw; n * hw < end; ++n) {  // the planes this part touches, each a contiguous range
        const float* plane = y + (n * s.C_out + c) * hw;
        const int64_t lo = begin > n * hw ? begin - n * hw : 0, hi = end < (n + 1) * hw ? end - n * hw : hw;
        for (int64_t q = lo + threadIdx.x; q < hi; q += S_THREADS) {
            const float v = plane[q] - piv;
            w.n += 1.f;
            const float d = v - w.mean;
            w.mean += __fdividef(d, w.n);  // an IEEE division per value made the pass compute-bound (3×)
            w.m2 = fmaf(d, v - w.mean, w.m2);
        }
    }
    w = kb::welford_block_reduce(w, scratch);
    if (threadIdx.x == 0) st.partial[static_cast<int64_t>(c) * parts + part] = w;
    last_block_finishes(st, s, parts);
}

// The in-place strategy; with a guard, only when *guard == 1 ("auto" chose it). By FFMA (statistics in the
// convolution's epilogue), or on the tensor cores (math): conv_tf32.cuh writes y, channel_stats_kernel reads it.
cudaError_t train_inplace(const float* x, const float* w, const float* b, float* y, const float* gamma,
                          const float* beta, float* running_mean, float* running_var,
                          int64_t* num_batches_tracked, float* mab, void* partial, int64_t slots,
                          unsigned* arrivals, int64_t N, int C_in, int H, int W, int C_out, float momentum,
                          float eps, float scale, const unsigned* guard, int math, cudaStream_t stream) {
    Shape s = make_shape(N, C_in, H, W, C_out, y);
    s.n_tiles = static_cast<int>(cbs_tiles(N, H, W, C_out));
    const int64_t HW = static_cast<int64_t>(s.HO) * s.WO;
    const Apply p{y, mab, num_batches_tracked, N, C_out, HW};  // the in-place apply's parameters
    Stats st{static_cast<kb::Welford<float>*>(partial), arrivals, mab, gamma, beta, running_mean,
             running_var, num_batches_tracked, momentum, eps, scale, guard, 1u, math == kCbsFp32, b, mab + 4 * C_out};
    constexpr int per_block = P_THREADS / 32;  // channels per pivots_kernel block
    pivots_kernel<<<static_cast<unsigned>((C_out + per_block - 1) / per_block), P_THREADS, 0, stream>>>(x, w, s, st);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    if (math == kCbs3xTf32) {
        err = tc_conv(x, w, b, y, N, C_in, H, W, C_out, guard, 1u, stream);
        if (err != cudaSuccess) return err;
        // parts per channel: ≈ 2,048 blocks in all, at most the slots the caller allocated, at least 1
        const int64_t want = (2048 + C_out - 1) / C_out, parts = want < slots ? want : slots;
        channel_stats_kernel<<<static_cast<unsigned>(C_out * parts), S_THREADS, 0, stream>>>(y, s, st,
                                                                                            static_cast<int>(parts));
        err = cudaGetLastError();
    } else if (math == kCbsFp32) {
        // the accumulators start at −(the filter on the pivots), in the bias's place: y − P is written
        err = launch<true>(x, w, st.pivots, y, s, st, static_cast<int>(slots / WROWS), stream);
    } else {
        return cudaErrorInvalidValue;
    }
    if (err != cudaSuccess) return err;
    return launch_apply_inplace(p, guard, stream);
}

// The moments' statistics and fold (conv_moments.cuh): four kernels, no convolution. acc: the workspace. The
// main sums by FFMA, or on the tensor cores (math 3xTF32), with the guard's error model for that arithmetic
// (cbm::GuardModel, measured: the tensor cores' products err more than FFMA's exact ones, but they join in float32
// every eight and in double every tile, so their spread is at most twice FFMA's and their floor a few u).
cudaError_t moments_fold(const float* x, double* acc, cbm::Finalize f, int64_t N, int C_in, int H, int W, int math,
                         cudaStream_t stream) {
    // cbm:: names spelled out: namespace cbs has its own THREADS, K3 and smem_bytes<bool> (the convolution's),
    // which win over a using-directive's — an unqualified smem_bytes<16>() meant cbs::smem_bytes<true>() and
    // launched the main kernel 21 KB of shared memory short (an out-of-bounds write that compute-sanitizer found).
    using cbm::MShape, cbm::moments_main_kernel, cbm::moments_tc_kernel, cbm::ACC_DOUBLES, cbm::TCOLS;
    // per device: {rows per tile, FFMA main-kernel blocks, tensor-core main-kernel blocks} (static: see
    // resident_blocks)
    static int resident[64][3] = {};
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) return err;
    int* cfg = resident[device % 64];
    const bool tc = math == kCbs3xTf32;
    if (cfg[tc ? 2 : 1] == 0) {
        int optin = 0, sms = 0, per_sm = 0;
        err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
        if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
        if (err != cudaSuccess) return err;
        const bool wide = optin >= cbm::smem_bytes<16>();
        if (tc) {  // sm_80 or newer (the binding checks): 78,976 B fit every such GPU
            err = cudaFuncSetAttribute(moments_tc_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, cbm::T_SMEM);
            if (err == cudaSuccess)
                err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, moments_tc_kernel, cbm::T_THREADS,
                                                                    cbm::T_SMEM);
        } else {
            err = wide ? cudaFuncSetAttribute(moments_main_kernel<16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              cbm::smem_bytes<16>())
                       : cudaFuncSetAttribute(moments_main_kernel<8>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              cbm::smem_bytes<8>());
            if (err == cudaSuccess)
                err = wide ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, moments_main_kernel<16>,
                                                                           cbm::THREADS, cbm::smem_bytes<16>())
                           : cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, moments_main_kernel<8>,
                                                                           cbm::THREADS, cbm::smem_bytes<8>());
        }
        if (err != cudaSuccess) return err;
        if (!tc) cfg[0] = wide ? 16 : 8;
        cfg[tc ? 2 : 1] = sms * (per_sm > 0 ? per_sm : 1);
    }
    const int band = tc ? cbm::T_BAND : cfg[0];
    MShape s{static_cast<int>(N), C_in, H, W, (H + band - 1) / band, (W + TCOLS - 1) / TCOLS, 0,
             W % 4 == 0 && (reinterpret_cast<uintptr_t>(x) & 15) == 0};
    s.tiles = N * s.row_tiles * s.col_tiles;
    if (tc && s.tiles > INT_MAX) return cudaErrorInvalidValue;  // its tile counter is 32-bit (16 TB of input)
    err = cudaMemsetAsync(acc, 0, sizeof(double) * ACC_DOUBLES, stream);
    if (err != cudaSuccess) return err;
    const int blocks = cfg[tc ? 2 : 1];
    const int grid = static_cast<int>(s.tiles < blocks ? s.tiles : blocks);
    if (tc) {
        moments_tc_kernel<<<grid, cbm::T_THREADS, cbm::T_SMEM, stream>>>(x, s, acc);
        f.model = cbm::GUARD_TF32;
    } else if (band == 16) {
        moments_main_kernel<16><<<grid, cbm::THREADS, cbm::smem_bytes<16>(), stream>>>(x, s, acc);
    } else {
        moments_main_kernel<8><<<grid, cbm::THREADS, cbm::smem_bytes<8>(), stream>>>(x, s, acc);
    }
    cbm::moments_edge_kernel<<<dim3(static_cast<unsigned>(N), 4), cbm::E_THREADS, 0, stream>>>(x, s, acc);
    cbm::moments_cov_kernel<<<C_in * cbm::K3 * cbm::K3, 128, 0, stream>>>(s, acc, f);
    cbm::moments_fold_kernel<<<f.C_out, cbm::F_THREADS, 0, stream>>>(x, s, acc, f);
    return cudaGetLastError();
}

bool moments_ok(int64_t N, int C_in, int H, int W) {
    return C_in >= 1 && C_in <= cbm::CI_MAX && H >= K3 && W >= K3 && N >= 1 && N <= INT_MAX;
}

}  // namespace cbs

// Eval mode: y = conv(x, w) + b (w, b folded from BN and the scale by the caller; b may be null).
cudaError_t launch_cbs_eval(const float* x, const float* w, const float* b, float* y, int64_t N, int C_in, int H,
                            int W, int C_out, int math, cudaStream_t stream) {
    return cbs::eval(x, w, b, y, N, C_in, H, W, C_out, nullptr, math, stream);
}

// Training mode: y = conv(x, w) + b with per-channel statistics, then y ← BN(y)·s in place (the in-place apply
// kernel, which also counts the batch); the convolution by FFMA or on the tensor cores (math). Workspaces:
// partial [C_out · slots] Welford states (slots from cbs_train_slots), mab [6·C_out], arrivals [1] zeroed.
cudaError_t launch_cbs_train(const float* x, const float* w, const float* b, float* y, const float* gamma,
                             const float* beta, float* running_mean, float* running_var,
                             int64_t* num_batches_tracked, float* mab, void* partial, int64_t slots,
                             unsigned* arrivals, int64_t N, int C_in, int H, int W, int C_out, float momentum,
                             float eps, float scale, int math, cudaStream_t stream) {
    if (cbs_tiles(N, H, W, C_out) == 0) return cudaSuccess;
    if (!cbs::inplace_ok(N, H, W, C_out, slots, y) || (math == kCbs3xTf32 && C_in > cbt::CI))
        return cudaErrorInvalidValue;
    return cbs::train_inplace(x, w, b, y, gamma, beta, running_mean, running_var, num_batches_tracked, mab, partial,
                              slots, arrivals, N, C_in, H, W, C_out, momentum, eps, scale, nullptr, math, stream);
}

// The tensor-core convolution's instruction on the current GPU: 1 wgmma, 0 mma.sync (-1 on an error); with
// mma_sync ≥ 0, first set whether mma.sync is forced (1) or not (0). Returns the setting before the call in
// bit 1 (2 when mma.sync was forced).
int cbs_tc_instruction(int mma_sync) {
    const int before = cbs::g_tc_mma_sync;
    if (mma_sync >= 0) cbs::g_tc_mma_sync = mma_sync != 0;
    bool wgmma = false;
    if (cbs::tc_uses_wgmma(&wgmma) != cudaSuccess) return -1;
    return (wgmma ? 1 : 0) | (before ? 2 : 0);
}

// The moments strategy's limits: C_in ≤ 8 (the main kernel's accumulators) and its workspace (doubles); the
// guard's flag and its prediction in the workspace (the statistics' predicted error, the allowance and the
// tensor-core convolution's predicted error, consecutive), and its model for the sums' arithmetic: {u, floor,
// spread, allowance factor, the convolution's unit} (the allowance for C_in input channels is
// factor·u·√(C_in·9)).
int cbs_moments_max_channels() { return cbm::CI_MAX; }
int64_t cbs_moments_workspace() { return cbm::WORKSPACE_DOUBLES; }
int64_t cbs_guard_offset() { return cbm::GUARD_OFFSET; }
int64_t cbs_guard_prediction_offset() { return cbm::RISK_OFFSET + cbm::RISK_PREDICTED; }
void cbs_guard_model(int math, double* out) {
    const cbm::GuardModel m = math == kCbs3xTf32 ? cbm::GUARD_TF32 : cbm::GUARD_FFMA;
    out[0] = cbm::U32;
    out[1] = m.floor;
    out[2] = m.spread;
    out[3] = cbm::GUARD_ALLOWANCE;
    out[4] = cbm::CONV_TF32_UNIT;
}

// Training mode from the input's moments (conv_moments.cuh): statistics, running statistics and the folded
// weights w_fold (C_out·C_in·9) and b_fold (C_out) from four kernels, then the eval convolution on them.
// acc: cbs_moments_workspace() doubles of workspace (its sums zeroed here).
cudaError_t launch_cbs_train_moments(const float* x, const float* w, const float* b, float* y, const float* gamma,
                                     const float* beta, float* running_mean, float* running_var,
                                     int64_t* num_batches_tracked, double* acc, float* w_fold, float* b_fold,
                                     int64_t N, int C_in, int H, int W, int C_out, float momentum, float eps,
                                     float scale, int math, cudaStream_t stream) {
    if (!cbs::moments_ok(N, C_in, H, W)) return cudaErrorInvalidValue;
    const cbm::Finalize f{w, b, gamma, beta, running_mean, running_var, num_batches_tracked, w_fold, b_fold,
                          nullptr, nullptr, nullptr, C_out, momentum, eps, scale};
    const cudaError_t err = cbs::moments_fold(x, acc, f, N, C_in, H, W, math, stream);
    if (err != cudaSuccess) return err;
    return cbs::eval(x, w_fold, b_fold, y, N, C_in, H, W, C_out, nullptr, math, stream);
}

// "auto" (C_in ≤ 8): the moments' statistics and fold with the guard, then every path's launches, each gated by
// the flag the fold kernel wrote (conv_moments.cuh): no host synchronisation. math: the moments' sums and their
// convolution (with math 3xTF32, the FFMA convolution where the guard predicts that the tensor cores' would
// cost the output its accuracy); inplace_math: the in-place path's convolution. Workspaces: those of
// both strategies (the in-place path's arrivals counter lives in acc, zeroed by the cov kernel), and staged
// [2·C_out] floats when the running statistics are tracked.
cudaError_t launch_cbs_train_auto(const float* x, const float* w, const float* b, float* y, const float* gamma,
                                  const float* beta, float* running_mean, float* running_var,
                                  int64_t* num_batches_tracked, double* acc, float* w_fold, float* b_fold,
                                  float* staged, float* mab, void* partial, int64_t slots, int64_t N, int C_in,
                                  int H, int W, int C_out, float momentum, float eps, float scale, int math,
                                  int inplace_math, cudaStream_t stream) {
    if (cbs_tiles(N, H, W, C_out) == 0) return cudaSuccess;
    if (!cbs::moments_ok(N, C_in, H, W) || !cbs::inplace_ok(N, H, W, C_out, slots, y) ||
        (running_mean != nullptr && staged == nullptr))
        return cudaErrorInvalidValue;
    // excerpt: auto
    unsigned* guard = reinterpret_cast<unsigned*>(acc + cbm::GUARD_OFFSET);  // [0] flag, [1] arrivals
    cbm::Finalize f{w, b, gamma, beta, running_mean, running_var, num_batches_tracked, w_fold, b_fold,
                    guard, acc + cbm::RISK_OFFSET, running_mean ? staged : nullptr, C_out, momentum, eps, scale};
    f.tc_conv = math == kCbs3xTf32;
    cudaError_t err = cbs::moments_fold(x, acc, f, N, C_in, H, W, math, stream);
    if (err != cudaSuccess) return err;
    if (running_mean) {
        cbm::moments_commit_kernel<<<1, cbm::C_THREADS, 0, stream>>>(f);  // flag 0: the staged statistics
        err = cudaGetLastError();
        if (err != cudaSuccess) return err;
    }
    err = cbs::eval(x, w_fold, b_fold, y, N, C_in, H, W, C_out, guard, math, stream);  // flag 0
    if (err == cudaSuccess && f.tc_conv)  // flag 2
        err = cbs::eval(x, w_fold, b_fold, y, N, C_in, H, W, C_out, guard, kCbsFp32, stream,
                        cbm::FLAG_MOMENTS_FFMA_CONV);
    if (err != cudaSuccess) return err;
    return cbs::train_inplace(x, w, b, y, gamma, beta, running_mean, running_var, num_batches_tracked, mab,
                              partial, slots, guard + 1, N, C_in, H, W, C_out, momentum, eps, scale, guard,
                              inplace_math, stream);  // flag 1
    // end excerpt: auto
}

// The guard alone, for inspection: the moments' statistics with the guard on x, w and BN's γ, β, ε and the scale
// (nothing else written but the workspaces); once the stream has run, the flag is acc[cbs_guard_offset()]'s first
// 32-bit word (cbm::FLAG_*), and the statistics' predicted error, its allowance and the tensor-core convolution's
// predicted error are acc[cbs_guard_prediction_offset()] and the next two doubles.
cudaError_t launch_cbs_guard_probe(const float* x, const float* w, const float* b, const float* gamma,
                                   const float* beta, double* acc, float* w_fold, float* b_fold, int64_t N, int C_in,
                                   int H, int W, int C_out, float eps, float scale, int math, cudaStream_t stream) {
    if (!cbs::moments_ok(N, C_in, H, W)) return cudaErrorInvalidValue;
    unsigned* guard = reinterpret_cast<unsigned*>(acc + cbm::GUARD_OFFSET);
    cbm::Finalize f{w, b, gamma, beta, nullptr, nullptr, nullptr, w_fold, b_fold, guard, acc + cbm::RISK_OFFSET,
                    nullptr, C_out, -1.f, eps, scale};
    f.tc_conv = math == kCbs3xTf32;
    return cbs::moments_fold(x, acc, f, N, C_in, H, W, math, stream);
}
