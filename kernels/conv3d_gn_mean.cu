// conv3d_gn_mean.cu — P27 in one kernel: y[b, c] = mean over (D, H, W) of GroupNorm(hardswish(conv3d(x)))[b, c],
// stride 1, no padding, 4×4×4 filters, NCDHW float32, float32-accurate: FFMA, or the tensor cores with the
// 3xTF32 split. The conv output is never written.
//
// The algebra: with h = hardswish(conv(x)), m_c the mean of h over channel c of
// sample b, and μ_g, var_g the statistics of c's group (biased variance),
//     mean_DHW(GN(h))[b, c] = γ_c · (m_c − μ_g) / √(var_g + ε) + β_c,
// so per-(b, c) statistics suffice. A channel's statistics are shifted sums: Σd and Σd² with d = 6h − K6_c,
// K6_c = 6h at position (0, 0, 0) of (b, c) — a value of the data, so |mean − pivot| is of the order of the
// spread and the variance (Σd² − (Σd)²/n)/n does not cancel catastrophically even when |mean| ≫ std (inputs
// shifted by 1e3). The factor 6 is hardswish's division, folded into the statistics: 6h = v·clamp(v+3, 0, 6)
// is one FFMA away from d. Channels merge into groups exactly (within + between sums of squares), in double.
//
// p27_fused_kernel — one block per sample (512 threads). The block stages the sample's input (or a slab of
// output depths with its 3-plane halo, when the sample does not fit) and all weights in shared memory, and
// each thread computes work items of 8 output channels × 8 consecutive output columns of one output row
// (64 accumulators): per input channel and filter (kd, kh) it reads 12 input values (3 float4) and 8 float4
// weight broadcasts and issues 256 FFMAs (23 FFMA per shared-memory load). Warps are tied to one channel group
// for the whole sample, so each thread keeps its 8 channels' sums in registers; they are merged by warp
// shuffles and, per block, in double. No other block touches the sample: no atomics, no finalise kernel.
//
// p27_tc_kernel — the same plan with the convolution on the tensor cores (math 3xTF32, sm_80+, C_out ≤ 16); see
// its section below.
//
// p27_tail_kernel — the "fuse only the tail" baseline: from a materialised conv output (N, C, S), one block
// per sample does hardswish, the same shifted statistics and the same finalisation.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "conv3d_gn_mean.h"
#include "tf32.cuh"

namespace {

constexpr int KS = 4;                 // filter size (the fused kernel is specialised for 4×4×4)
constexpr int TAPS = KS * KS * KS;    // 64 taps per input channel
constexpr int CO_T = 8;               // output channels per thread (two float4 weight broadcasts)
constexpr int COLS = 8;               // output columns per thread
constexpr int WIN = 12;               // input columns a thread reads per filter row: COLS + KS − 1 = 11, as 3 float4
constexpr int THREADS = 512;          // 16 warps: 4 per scheduler on sm_80/sm_90, at most 128 registers each
constexpr int WARPS = THREADS / 32;
constexpr int SLACK = 16;             // zeroed floats after the staged input: reads of masked columns past the end
// Filter depths unrolled in the inner loop (1, 2 or 4). Unrolled, the kd loop saves its ~45 address and loop
// instructions per 1024 FFMAs (4 %) but multiplies the code (1024 FFMAs = 16 KB per kd); a compile-time knob
// (-DKB_P27_KD_UNROLL=4) for the GPU to decide.
#ifndef KB_P27_KD_UNROLL
#define KB_P27_KD_UNROLL 1
#endif
constexpr int KD_UNROLL = KB_P27_KD_UNROLL;  // #pragma unroll takes a constant expression, not a macro
constexpr int TAIL_THREADS = 512;
constexpr int TAIL_WARPS = TAIL_THREADS / 32;

struct Shape {
    int C_in, D, H, W;        // input (per sample)
    int C_out, C_pad, G8;     // output channels, padded to 8·G8 with G8 a divisor of 16 (warps per group = 16/G8)
    int DO, HO, WO;           // conv output
    int num_groups;
    int Wp;                   // staged row pitch in floats (a multiple of 4)
    int T;                    // output depths per staged slab
    int CT;                   // column items per output row: ceil(WO / 8), tensor cores ceil(WO / 32)
    int in_floats;            // staged input floats per block (C_in·(T+3)·H·Wp + slack_floats)
    float eps;
};

__device__ __forceinline__ float hswish6(float v) {  // 6·hardswish(v) = v · clamp(v + 3, 0, 6)
    return v * fminf(fmaxf(v + 3.0f, 0.0f), 6.0f);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Copies rows_in rows of `w` elements (row r of input channel ci at src[ci·src_ci + src_off + r·w]) into
// rows of `pitch` elements (dst[ci·dst_ci + r·pitch]), zero-filling columns w … pitch−1; rows_per_ci rows per
// channel. STAGE loads are issued before their stores, so each thread has STAGE loads in flight.
constexpr int STAGE = 8;
template <int NTHREADS, typename V>
__device__ __forceinline__ void stage_rows(const V* __restrict__ src, V* dst, int rows_in, int pitch, int w,
                                           int rows_per_ci, int dst_ci, int64_t src_ci, int64_t src_off) {
    const int items = rows_in * pitch;
    for (int i0 = threadIdx.x; i0 < items; i0 += NTHREADS * STAGE) {
        V v[STAGE];
        int d[STAGE];
#pragma unroll
        for (int u = 0; u < STAGE; ++u) {
            const int i = i0 + u * NTHREADS;
            const int row = i / pitch, col = i - row * pitch;
            const int ci = row / rows_per_ci, r = row - ci * rows_per_ci;
            d[u] = i < items ? ci * dst_ci + r * pitch + col : -1;
            v[u] = V{};
            if (i < items && col < w) v[u] = src[ci * src_ci + src_off + static_cast<int64_t>(r) * w + col];
        }
#pragma unroll
        for (int u = 0; u < STAGE; ++u)
            if (d[u] >= 0) dst[d[u]] = v[u];
    }
}

// One step of a warp reduce-scatter: 2H values per lane → H, summed over lane pairs (l, l ^ 2H). Lanes whose
// bit 2H is set keep the upper half. After H = 8, 4, 2, 1, lane l holds the sum over lanes l, l^2, l^4, … l^16
// of value l >> 1 (of the original 16); the caller adds lane l^1's.
template <int H>
__device__ __forceinline__ void reduce_scatter(float (&t)[2 * CO_T], int lane) {
    const bool up = (lane & (2 * H)) != 0;
#pragma unroll
    for (int i = 0; i < H; ++i) {
        const float send = up ? t[i] : t[i + H];
        const float keep = up ? t[i + H] : t[i];
        t[i] = keep + __shfl_xor_sync(0xffffffffu, send, 2 * H);
    }
    if constexpr (H > 1) reduce_scatter<H / 2>(t, lane);
}

// From per-channel (mean, M2) of h over n positions each (in shared memory, double), GroupNorm's group
// statistics and the output row out[0 .. C_out). Threads 0 … C_out−1 of the block each write one value.
// excerpt: finalize
__device__ void finalize_sample(const double* mean_s, const double* m2_s, int C_out, int num_groups, double n,
                                const float* __restrict__ gw, const float* __restrict__ gb, float eps,
                                float* __restrict__ out) {
    const int c = threadIdx.x;
    if (c >= C_out) return;
    const int cpg = C_out / num_groups;
    const int c0 = (c / cpg) * cpg;
    double mu = 0.0;
    for (int k = 0; k < cpg; ++k) mu += mean_s[c0 + k];
    mu /= cpg;
    double m2 = 0.0;  // within-channel plus between-channel sums of squares: exact merge of equal-count states
    for (int k = 0; k < cpg; ++k) {
        const double dm = mean_s[c0 + k] - mu;
        m2 += m2_s[c0 + k] + n * dm * dm;
    }
    const double var = m2 / (n * cpg);
    const double g = gw ? static_cast<double>(gw[c]) : 1.0;
    const double be = gb ? static_cast<double>(gb[c]) : 0.0;
    out[c] = static_cast<float>(g * (mean_s[c] - mu) / sqrt(var + static_cast<double>(eps)) + be);
}
// end excerpt: finalize

// (mean, M2) of h for a channel from shifted sums of d = 6h − K6 over n values.
__device__ __forceinline__ void channel_state(double s1, double s2, float k6, double n, double* mean, double* m2) {
    *mean = (static_cast<double>(k6) + s1 / n) / 6.0;
    const double m = (s2 - s1 * s1 / n) / 36.0;
    *m2 = m > 0.0 ? m : 0.0;
}

// Stages planes od0 … od0+planes−1 of every input channel of sample b: rows of W floats into rows of pitch Wp,
// zero-padded. Each trip first issues STAGE loads per thread, then stores them: STAGE loads in flight per thread
// (a load-then-store loop kept one in flight, and one block per SM waits for the whole sample).
template <int NTHREADS>
__device__ __forceinline__ void stage_slab(const float* __restrict__ x, float* in_s, const Shape& s, int64_t b,
                                           int od0, int planes, int ci_stride) {
    const int rows_in = s.C_in * planes * s.H;
    const float* xs = x + b * s.C_in * static_cast<int64_t>(s.D) * s.H * s.W;
    if ((s.W & 3) == 0 && (reinterpret_cast<uintptr_t>(x) & 15) == 0) {
        const int64_t plane4 = static_cast<int64_t>(s.H) * (s.W / 4);  // float4 per input plane
        stage_rows<NTHREADS, float4>(reinterpret_cast<const float4*>(xs), reinterpret_cast<float4*>(in_s), rows_in,
                           s.Wp / 4, s.W / 4, planes * s.H, ci_stride / 4, s.D * plane4, od0 * plane4);
    } else {
        stage_rows<NTHREADS, float>(xs, in_s, rows_in, s.Wp, s.W, planes * s.H, ci_stride,
                          static_cast<int64_t>(s.D) * s.H * s.W, static_cast<int64_t>(od0) * s.H * s.W);
    }
}

// Pivots: K6_c = 6·hardswish(conv) at output (0, 0, 0) for channels c < n_ch, one warp per channel, lanes over
// the taps; weight(t, c) is tap t = ci·64 + (kd, kh, kw) of channel c.
template <typename Weight>
__device__ __forceinline__ void pivots(const float* in_s, const Shape& s, int ci_stride, const float* bias_s,
                                       float* piv, int n_ch, Weight weight) {
    const int lane = threadIdx.x & 31;
    for (int c = threadIdx.x >> 5; c < n_ch; c += blockDim.x >> 5) {
        float v = 0.0f;
        for (int t = lane; t < s.C_in * TAPS; t += 32) {
            const int ci = t / TAPS, tap = t % TAPS;
            const int kd = tap / (KS * KS), kh = (tap / KS) % KS, kw = tap % KS;
            v = fmaf(in_s[ci * ci_stride + (kd * s.H + kh) * s.Wp + kw], weight(t, c), v);
        }
        v = warp_sum(v) + bias_s[c];
        if (lane == 0) piv[c] = hswish6(v);
    }
}

__global__ void __launch_bounds__(THREADS, 1)
p27_fused_kernel(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ cb,
                 const float* __restrict__ gw, const float* __restrict__ gb, float* __restrict__ out, Shape s) {
    extern __shared__ float4 smem4[];
    double* mean_s = reinterpret_cast<double*>(smem4);           // [C_pad]
    double* m2_s = mean_s + s.C_pad;                             // [C_pad]
    float* w_s = reinterpret_cast<float*>(m2_s + s.C_pad);       // [C_in·64][C_pad]: w_s[(ci·64 + tap)·C_pad + co]
    float* in_s = w_s + s.C_in * TAPS * s.C_pad;                 // [C_in][T+3][H][Wp] + SLACK
    float* red = in_s + s.in_floats;                             // [WARPS][CO_T][2]
    float* piv = red + WARPS * CO_T * 2;                         // [C_pad]  K6 per channel
    float* bias_s = piv + s.C_pad;                               // [C_pad]

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t b = blockIdx.x;
    const int w_floats = s.C_in * TAPS * s.C_pad;
    for (int i0 = tid; i0 < w_floats; i0 += THREADS * STAGE) {  // STAGE loads in flight, then their stores
        float v[STAGE];
#pragma unroll
        for (int u = 0; u < STAGE; ++u) {
            const int i = i0 + u * THREADS, co = i % s.C_pad, k = i / s.C_pad;
            v[u] = i < w_floats && co < s.C_out ? w[static_cast<int64_t>(co) * s.C_in * TAPS + k] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < STAGE; ++u)
            if (i0 + u * THREADS < w_floats) w_s[i0 + u * THREADS] = v[u];
    }
    for (int i = tid; i < s.C_pad; i += THREADS) bias_s[i] = (cb && i < s.C_out) ? cb[i] : 0.0f;
    for (int i = tid; i < SLACK; i += THREADS) in_s[s.in_floats - SLACK + i] = 0.0f;

    const int g = warp % s.G8;            // this warp's channel group, for the whole sample
    const int slot = warp / s.G8, slots = WARPS / s.G8;
    const int co0 = g * CO_T;
    const int ci_stride = (s.T + 3) * s.H * s.Wp;  // staged floats per input channel
    float stat = 0.0f;  // the warp's running total of one of its 16 sums (Σd, Σd² for 8 channels): see below

    for (int od0 = 0; od0 < s.DO; od0 += s.T) {
        const int Tc = min(s.T, s.DO - od0), planes = Tc + 3;
        if (od0 > 0) __syncthreads();  // every thread is done with the previous slab
        stage_slab<THREADS>(x, in_s, s, b, od0, planes, ci_stride);
        __syncthreads();

        if (od0 == 0) {
            pivots(in_s, s, ci_stride, bias_s, piv, s.C_pad, [&](int t, int c) { return w_s[t * s.C_pad + c]; });
            __syncthreads();
        }

        // excerpt: items
        // Work items of this slab: (output row = (od, oh), column block q), 8 channels × 8 columns each.
        const int items = Tc * s.HO * s.CT;
        // The loop is warp-uniform (the shuffles below need all 32 lanes); lanes past the end idle through it.
        for (int jb = slot * 32; jb < items; jb += slots * 32) {
            const int j = jb + lane;
            float t[2 * CO_T];  // this item's Σd and Σd² per channel
#pragma unroll
            for (int i = 0; i < 2 * CO_T; ++i) t[i] = 0.0f;
            if (j < items) {
            const int row = j / s.CT, q = j - row * s.CT;
            const int odl = row / s.HO, oh = row - odl * s.HO;
            const float* ip = in_s + (odl * s.H + oh) * s.Wp + q * COLS;
            float acc[CO_T][COLS];
#pragma unroll
            for (int c = 0; c < CO_T; ++c)
#pragma unroll
                for (int jj = 0; jj < COLS; ++jj) acc[c][jj] = bias_s[co0 + c];
            // end excerpt: items

            // excerpt: inner-loop
#pragma unroll 1
            for (int ci = 0; ci < s.C_in; ++ci) {
#pragma unroll KD_UNROLL
                for (int kd = 0; kd < KS; ++kd) {
                    const float* rp = ip + ci * ci_stride + kd * s.H * s.Wp;
                    const float* wr = w_s + (ci * TAPS + kd * KS * KS) * s.C_pad + co0;
#pragma unroll
                    for (int kh = 0; kh < KS; ++kh) {
                        float v[WIN];
#pragma unroll
                        for (int u = 0; u < WIN / 4; ++u) {
                            const float4 t = *reinterpret_cast<const float4*>(rp + kh * s.Wp + 4 * u);
                            v[4 * u] = t.x; v[4 * u + 1] = t.y; v[4 * u + 2] = t.z; v[4 * u + 3] = t.w;
                        }
#pragma unroll
                        for (int kw = 0; kw < KS; ++kw) {
                            const float4* wp = reinterpret_cast<const float4*>(wr + (kh * KS + kw) * s.C_pad);
                            const float4 wa = wp[0], wb = wp[1];
                            const float wq[CO_T] = {wa.x, wa.y, wa.z, wa.w, wb.x, wb.y, wb.z, wb.w};
#pragma unroll
                            for (int c = 0; c < CO_T; ++c)
#pragma unroll
                                for (int jj = 0; jj < COLS; ++jj) acc[c][jj] = fmaf(v[jj + kw], wq[c], acc[c][jj]);
                        }
                    }
                }
            }
            // end excerpt: inner-loop

            // excerpt: epilogue
            // Epilogue: hardswish and shifted sums; columns past WO (the last column block) are left out.
            const int nv = s.WO - q * COLS;
#pragma unroll
            for (int c = 0; c < CO_T; ++c) {
                const float k6 = piv[co0 + c];
#pragma unroll
                for (int jj = 0; jj < COLS; ++jj) {
                    const float a = acc[c][jj];
                    const float d = fmaf(a, fminf(fmaxf(a + 3.0f, 0.0f), 6.0f), -k6);
                    if (jj < nv) {
                        t[2 * c] += d;
                        t[2 * c + 1] = fmaf(d, d, t[2 * c + 1]);
                    }
                }
            }
            }  // j < items
            // Reduce-scatter the 16 item sums over the warp: 16 shuffles, after which lane l holds the warp's
            // total of value l >> 1 (channel l >> 2, Σd or Σd²). One register per thread then carries the
            // sample's statistics instead of 16 (which spilled at 128 registers).
            reduce_scatter<CO_T>(t, lane);
            stat += t[0] + __shfl_xor_sync(0xffffffffu, t[0], 1);
            // end excerpt: epilogue
        }
    }

    // Merge the warps of each channel group in double. Lanes l and l^1 hold the same value.
    if ((lane & 1) == 0) red[warp * CO_T * 2 + (lane >> 1)] = stat;
    __syncthreads();
    const double n = static_cast<double>(s.DO) * s.HO * s.WO;
    if (tid < s.C_pad) {
        const int gg = tid / CO_T, c = tid % CO_T;
        double s1 = 0.0, s2 = 0.0;
        for (int wv = gg; wv < WARPS; wv += s.G8) {
            s1 += red[(wv * CO_T + c) * 2];
            s2 += red[(wv * CO_T + c) * 2 + 1];
        }
        channel_state(s1, s2, piv[tid], n, &mean_s[tid], &m2_s[tid]);
    }
    __syncthreads();
    finalize_sample(mean_s, m2_s, s.C_out, s.num_groups, n, gw, gb, s.eps, out + b * s.C_out);
}

// ---- The tensor-core path (math = 3xTF32, sm_80+): the same sample-per-block plan, the convolution as an
// implicit GEMM on mma.sync m16n8k8 TF32 with the 3xTF32 split (tf32.cuh), float32-accurate.
// The GEMM of one output row: M = 16 output channels (one mma tile; C_out ≤ 16), N = output columns (tiles of
// 8), K = C_in · 64 taps in 8-deep k-steps (ci, kd, kh pair, kw): k = t is tap (kd, kh0, t), k = t + 4 is
// (kd, kh0 + 1, t). So the B fragment of lane (g, t) — column g, depths t and t + 4 — is the staged input at
// rows kh0 and kh0 + 1, column g + t, shifted by the tap: no im2col. A warp's work item is two output rows ×
// 32 columns (4 column tiles); the two rows at kh pairs 0 and 2 read input rows 0 … 4, each loaded and split
// once for four mma tiles (5 loads for 8 fragments). The filter is split once per block into TF32 (hi, lo)
// planes in A-fragment order (one 16-byte load per fragment). The six products of a k-step pair (one (ci, kd);
// small terms first) start from zero and join the accumulator in one rounded FADD, as conv_tf32.cuh does per
// k-step: joined every k-step this kernel needs ~150 registers, and 16 warps allow 128 (it spilled and took
// 1.57 ms on an H200 against 1.32); its error on P27 moved by ±30 % either way.
constexpr int TC_CO = 16;             // output channels: one mma tile of 16 rows
constexpr int TC_ROWS = 2;            // output rows per work item
constexpr int TC_NT = 4;              // column tiles of 8 per work item: 32 output columns
constexpr int TC_KSTEPS = TAPS / 8;   // k-steps per input channel
constexpr int TC_PLANE = TC_KSTEPS * 32 * 4;  // TF32 words per input channel per plane (hi or lo)
constexpr int TC_THREADS = 512;      // 16 warps, at most 128 registers each

constexpr int TC_WARPS = TC_THREADS / 32;

__global__ void __launch_bounds__(TC_THREADS, 1)
p27_tc_kernel(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ cb,
              const float* __restrict__ gw, const float* __restrict__ gb, float* __restrict__ out, Shape s) {
    extern __shared__ float4 smem4[];
    double* mean_s = reinterpret_cast<double*>(smem4);                // [16]
    double* m2_s = mean_s + TC_CO;                                    // [16]
    double* red = m2_s + TC_CO;                                       // [TC_WARPS][16][2]
    uint32_t* w_hi = reinterpret_cast<uint32_t*>(red + TC_WARPS * TC_CO * 2);  // [C_in·8 k-steps][32 lanes][4]
    uint32_t* w_lo = w_hi + s.C_in * TC_PLANE;
    float* in_s = reinterpret_cast<float*>(w_lo + s.C_in * TC_PLANE);  // [C_in][T+3][H][Wp] + Wp + 32
    float* piv = in_s + s.in_floats;                                  // [16]  K6 per channel
    float* bias_s = piv + TC_CO;                                      // [16]

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int64_t b = blockIdx.x;
    // Word e of lane (g, t)'s A fragment at k-step k = ci·8 + kd·2 + p: W[g + 8·(e & 1)][ci][kd][2p + (e >> 1)][t].
    for (int i = tid; i < s.C_in * TC_PLANE; i += TC_THREADS) {
        const int e = i & 3, l = (i >> 2) & 31, k = i >> 7;
        const int co = (l >> 2) + 8 * (e & 1), ci = k / TC_KSTEPS, kd = (k % TC_KSTEPS) >> 1;
        const int kh = 2 * (k & 1) + (e >> 1), kw = l & 3;
        const float v = co < s.C_out ? w[(static_cast<int64_t>(co) * s.C_in + ci) * TAPS + (kd * KS + kh) * KS + kw]
                                     : 0.0f;
        kb::split(v, w_hi[i], w_lo[i]);
    }
    if (tid < TC_CO) bias_s[tid] = (cb && tid < s.C_out) ? cb[tid] : 0.0f;
    const int staged = s.C_in * (s.T + 3) * s.H * s.Wp;
    for (int i = staged + tid; i < s.in_floats; i += TC_THREADS) in_s[i] = 0.0f;

    for (int i = tid; i < TC_WARPS * TC_CO * 2; i += TC_THREADS) red[i] = 0.0;
    const int ci_stride = (s.T + 3) * s.H * s.Wp;
    const int pairs = (s.HO + TC_ROWS - 1) / TC_ROWS;

    for (int od0 = 0; od0 < s.DO; od0 += s.T) {
        const int Tc = min(s.T, s.DO - od0), planes = Tc + 3;
        if (od0 > 0) __syncthreads();
        stage_slab<TC_THREADS>(x, in_s, s, b, od0, planes, ci_stride);
        __syncthreads();
        if (od0 == 0) {
            pivots(in_s, s, ci_stride, bias_s, piv, TC_CO, [&](int tap, int c) {
                return c < s.C_out ? w[static_cast<int64_t>(c) * s.C_in * TAPS + tap] : 0.0f;
            });
            __syncthreads();
        }

        // excerpt: tc-items
        // Work items: (output depth, row pair, 32-column group); warp-uniform, one per warp at a time.
        const int items = Tc * pairs * s.CT;
        for (int j = warp; j < items; j += TC_WARPS) {
            const int cg = j % s.CT, rp = j / s.CT;
            const int oh = (rp % pairs) * TC_ROWS, ow0 = cg * 32;
            // Lane (g, t) of column tile n reads input rows oh … oh + 4 at column ow0 + 8n + g + t. Row 4 feeds
            // only the second output row; columns past WO and a second row past HO are computed, never counted
            // (they read into the next row or plane, or the zeroed slack: finite values).
            const float* ip = in_s + ((rp / pairs) * s.H + oh) * s.Wp + ow0 + g + t;
            float acc[TC_ROWS][TC_NT][4];
#pragma unroll
            for (int r = 0; r < TC_ROWS; ++r)
#pragma unroll
                for (int n = 0; n < TC_NT; ++n) {
                    acc[r][n][0] = acc[r][n][1] = bias_s[g];
                    acc[r][n][2] = acc[r][n][3] = bias_s[g + 8];
                }

#pragma unroll 1
            for (int ci = 0; ci < s.C_in; ++ci) {
#pragma unroll 1
                for (int kd = 0; kd < KS; ++kd) {
                    const float* p = ip + ci * ci_stride + kd * s.H * s.Wp;
                    uint32_t bh[5][TC_NT], bl[5][TC_NT];  // input rows 0 … 4 of the window, split
                    float step[TC_ROWS][TC_NT][4];
#pragma unroll
                    for (int h = 0; h < 2; ++h) {  // kh pair (2h, 2h + 1): rows 2h … 2h + 2 (row 2 serves both)
#pragma unroll
                        for (int i = 2 * h + (h > 0); i <= 2 * h + 2; ++i)
#pragma unroll
                            for (int n = 0; n < TC_NT; ++n) kb::split_fast(p[i * s.Wp + 8 * n], bh[i][n], bl[i][n]);
                        const int f = (((ci * KS + kd) * 2 + h) * 32 + lane) * 4;
                        const uint4 ah = *reinterpret_cast<const uint4*>(w_hi + f);
                        const uint4 al = *reinterpret_cast<const uint4*>(w_lo + f);
                        const uint32_t a_hi[4] = {ah.x, ah.y, ah.z, ah.w}, a_lo[4] = {al.x, al.y, al.z, al.w};
#pragma unroll
                        for (int r = 0; r < TC_ROWS; ++r)
#pragma unroll
                            for (int n = 0; n < TC_NT; ++n) {
                                const uint32_t fh[2] = {bh[2 * h + r][n], bh[2 * h + r + 1][n]};
                                const uint32_t fl[2] = {bl[2 * h + r][n], bl[2 * h + r + 1][n]};
                                if (h == 0) kb::mma0(step[r][n], a_lo, fh);  // small terms first, from zero
                                else kb::mma(step[r][n], a_lo, fh);
                                kb::mma(step[r][n], a_hi, fl);
                                kb::mma(step[r][n], a_hi, fh);
                                if (h == 1)  // the pair's six products join, rounded
#pragma unroll
                                    for (int e = 0; e < 4; ++e) acc[r][n][e] += step[r][n][e];
                            }
                    }
                }
            }
            // end excerpt: tc-items

            // Epilogue: lane (g, t) holds channels g (e < 2) and g + 8, columns ow0 + 8n + 2t (+1); rows and
            // columns past the output are left out of the sums.
            float part[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
#pragma unroll
            for (int r = 0; r < TC_ROWS; ++r) {
                if (oh + r >= s.HO) break;
#pragma unroll
                for (int n = 0; n < TC_NT; ++n)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const float a = acc[r][n][e];
                        const float d = fmaf(a, fminf(fmaxf(a + 3.0f, 0.0f), 6.0f), -piv[g + 8 * (e >> 1)]);
                        if (ow0 + 8 * n + 2 * t + (e & 1) < s.WO) {
                            part[e >> 1][0] += d;
                            part[e >> 1][1] = fmaf(d, d, part[e >> 1][1]);
                        }
                    }
            }
            // The item's sums over the four lanes of a channel (t = 0 … 3), then into the warp's totals, in double.
#pragma unroll
            for (int c = 0; c < 2; ++c)
#pragma unroll
                for (int m = 0; m < 2; ++m) {
                    float v = part[c][m];
                    v += __shfl_xor_sync(0xffffffffu, v, 1);
                    v += __shfl_xor_sync(0xffffffffu, v, 2);
                    if (t == 0) red[(warp * TC_CO + g + 8 * c) * 2 + m] += v;
                }
        }
    }
    __syncthreads();
    const double n = static_cast<double>(s.DO) * s.HO * s.WO;
    if (tid < TC_CO) {
        double s1 = 0.0, s2 = 0.0;
        for (int wv = 0; wv < TC_WARPS; ++wv) s1 += red[(wv * TC_CO + tid) * 2], s2 += red[(wv * TC_CO + tid) * 2 + 1];
        channel_state(s1, s2, piv[tid], n, &mean_s[tid], &m2_s[tid]);
    }
    __syncthreads();
    finalize_sample(mean_s, m2_s, s.C_out, s.num_groups, n, gw, gb, s.eps, out + b * s.C_out);
}

// The tail alone: y is the conv output (N, C, S) (any alignment). One block per sample; per channel, the
// threads stride over its S values, pivot = 6·hardswish of the first.
__global__ void __launch_bounds__(TAIL_THREADS)
p27_tail_kernel(const float* __restrict__ y, const float* __restrict__ gw, const float* __restrict__ gb,
                float* __restrict__ out, int C, int64_t S, int num_groups, float eps) {
    extern __shared__ double tail_smem[];
    double* mean_s = tail_smem;        // [C]
    double* m2_s = tail_smem + C;      // [C]
    __shared__ float red[TAIL_WARPS][2];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t b = blockIdx.x;
    for (int c = 0; c < C; ++c) {
        const float* p = y + (b * C + c) * S;
        const float k6 = hswish6(p[0]);
        float a = 0.0f, q2 = 0.0f;
        int64_t i = tid;
        for (; i + 3 * TAIL_THREADS < S; i += 4 * TAIL_THREADS) {
            float v[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) v[u] = p[i + u * TAIL_THREADS];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const float d = hswish6(v[u]) - k6;
                a += d;
                q2 = fmaf(d, d, q2);
            }
        }
        for (; i < S; i += TAIL_THREADS) {
            const float d = hswish6(p[i]) - k6;
            a += d;
            q2 = fmaf(d, d, q2);
        }
        a = warp_sum(a);
        q2 = warp_sum(q2);
        if (lane == 0) { red[warp][0] = a; red[warp][1] = q2; }
        __syncthreads();
        if (tid == 0) {
            double s1 = 0.0, s2 = 0.0;
            for (int wv = 0; wv < TAIL_WARPS; ++wv) { s1 += red[wv][0]; s2 += red[wv][1]; }
            channel_state(s1, s2, k6, static_cast<double>(S), &mean_s[c], &m2_s[c]);
        }
        __syncthreads();  // red is reused by the next channel
    }
    finalize_sample(mean_s, m2_s, C, num_groups, static_cast<double>(S), gw, gb, eps, out + b * C);
}

// Zeroed floats after the staged input, which masked outputs read past its end: FFMA, the last row's 12-float
// window; tensor cores, one row past the last plane (a row pair whose second row is past HO).
int slack_floats(int Wp, int math) { return math == kP27Tf32 ? Wp + 32 : SLACK; }

int pad_groups(int C_out) {  // channel groups of 8, rounded up to a divisor of 16 (warps split evenly)
    const int g = (C_out + CO_T - 1) / CO_T;
    int p = 1;
    while (p < g) p *= 2;
    return p;
}

}  // namespace

// Limits the binding checks before calling, so that they are reported as clear errors.
int p27_kernel_size() { return KS; }
int p27_max_out_channels(int math) { return math == kP27Tf32 ? TC_CO : CO_T * WARPS; }
int p27_tail_max_channels() { return TAIL_THREADS; }

// Shared memory the fused kernel needs for a slab of T output depths (bytes), for a row pitch Wp.
int64_t p27_smem_bytes(int C_in, int H, int Wp, int C_out, int T, int math) {
    const int64_t input = int64_t{C_in} * (T + 3) * H * Wp + slack_floats(Wp, math);
    if (math == kP27Tf32)  // statistics (double), filter planes (hi, lo), input, pivots and bias
        return (2 + TC_WARPS * 2) * int64_t{TC_CO} * 8 + 4 * (2 * int64_t{C_in} * TC_PLANE + input + 2 * TC_CO);
    const int64_t c_pad = int64_t{CO_T} * pad_groups(C_out);
    return 2 * c_pad * 8 + 4 * (int64_t{C_in} * TAPS * c_pad + input + WARPS * CO_T * 2 + 2 * c_pad);
}

// The slab depth T for this shape and shared-memory limit: all DO output depths when they fit, else the
// deepest balanced slabs that fit; 0 when not even one output depth (4 input planes) fits.
int p27_slab_depth(int C_in, int D, int H, int W, int C_out, int64_t max_smem, int math) {
    const int DO = D - KS + 1, Wp = (W + 3) / 4 * 4;
    int t_max = 0;
    for (int t = 1; t <= DO; ++t)
        if (p27_smem_bytes(C_in, H, Wp, C_out, t, math) <= max_smem) t_max = t;
        else break;  // the need grows with t
    if (t_max == 0) return 0;
    const int slabs = (DO + t_max - 1) / t_max;
    return (DO + slabs - 1) / slabs;
}

// The staged row pitch (floats) for a slab depth T: W rounded up to a float4, plus 4 floats when that keeps
// the same slab depth within max_smem. A pitch ≡ 4 (mod 8) floats puts the two rows a quarter-warp reads in
// different banks for the float4 input reads; P27 on an H200 has no room for it (2-way bank conflicts). The
// tensor-core path reads single floats of one row per instruction (no conflicts): W rounded up to a float4.
int p27_pitch(int C_in, int H, int W, int C_out, int T, int64_t max_smem, int math) {
    const int Wp = (W + 3) / 4 * 4;
    if (math != kP27Tf32 && (Wp / 4) % 2 == 0 && p27_smem_bytes(C_in, H, Wp + 4, C_out, T, math) <= max_smem)
        return Wp + 4;
    return Wp;
}

// The kernel's compile-time constants, in this order, for the binding's config(): filter size, output
// channels and output columns per thread, input columns read per filter row, threads per block of the fused
// and the tail kernel, filter depths unrolled, loads in flight per thread while staging.
int p27_constants(int* v, int n) {
    const int c[] = {KS, CO_T, COLS, WIN, THREADS, TAIL_THREADS, KD_UNROLL, STAGE};
    const int m = static_cast<int>(sizeof(c) / sizeof(c[0]));
    for (int i = 0; i < m && i < n; ++i) v[i] = c[i];
    return m;
}

cudaError_t launch_p27_fused(const float* x, const float* w, const float* cb, const float* gw, const float* gb,
                             float* out, int64_t N, int C_in, int D, int H, int W, int C_out, int num_groups,
                             float eps, int64_t max_smem, int math, cudaStream_t stream) {
    if (N == 0) return cudaSuccess;
    const bool tc = math == kP27Tf32;
    if (N > INT_MAX || C_out > (tc ? TC_CO : CO_T * WARPS) || num_groups < 1 || C_out % num_groups != 0 ||
        D < KS || H < KS || W < KS || (math != kP27Fp32 && !tc))
        return cudaErrorInvalidValue;
    Shape s;
    s.C_in = C_in; s.D = D; s.H = H; s.W = W;
    s.C_out = C_out; s.G8 = pad_groups(C_out); s.C_pad = CO_T * s.G8;
    s.DO = D - KS + 1; s.HO = H - KS + 1; s.WO = W - KS + 1;
    s.num_groups = num_groups;
    s.T = p27_slab_depth(C_in, D, H, W, C_out, max_smem, math);
    if (s.T == 0) return cudaErrorInvalidValue;
    s.Wp = p27_pitch(C_in, H, W, C_out, s.T, max_smem, math);
    s.CT = tc ? (s.WO + 8 * TC_NT - 1) / (8 * TC_NT) : (s.WO + COLS - 1) / COLS;
    s.in_floats = C_in * (s.T + 3) * H * s.Wp + slack_floats(s.Wp, math);
    s.eps = eps;
    const int64_t bytes = p27_smem_bytes(C_in, H, s.Wp, C_out, s.T, math);
    auto* kernel = tc ? p27_tc_kernel : p27_fused_kernel;
    static int64_t attr_set[2][64] = {};  // largest dynamic shared memory opted into, per kernel and device
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) return err;
    int64_t& opted = attr_set[tc][device % 64];
    if (bytes > 48 * 1024 && bytes > opted) {
        err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
        if (err != cudaSuccess) return err;
        opted = bytes;
    }
    const unsigned threads = tc ? TC_THREADS : THREADS;
    kernel<<<static_cast<unsigned>(N), threads, static_cast<size_t>(bytes), stream>>>(x, w, cb, gw, gb, out, s);
    return cudaGetLastError();
}

cudaError_t launch_p27_tail(const float* y, const float* gw, const float* gb, float* out, int64_t N, int C,
                            int64_t S, int num_groups, float eps, cudaStream_t stream) {
    if (N == 0) return cudaSuccess;
    if (N > INT_MAX || C < 1 || C > TAIL_THREADS || S < 1 || num_groups < 1 || C % num_groups != 0)
        return cudaErrorInvalidValue;
    const size_t bytes = 2 * sizeof(double) * static_cast<size_t>(C);  // ≤ 8 KB
    p27_tail_kernel<<<static_cast<unsigned>(N), TAIL_THREADS, bytes, stream>>>(y, gw, gb, out, C, S, num_groups,
                                                                                eps);
    return cudaGetLastError();
}
