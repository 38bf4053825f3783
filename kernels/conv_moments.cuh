// conv_moments.cuh — training-mode BatchNorm statistics of a 3×3 convolution's output, from the input's moments.
//
// The output of a convolution is linear in the input patches: y_c(p) = w_c · P(p) + bias_c, where P(p) holds the
// K = C_in·3·3 input values under the filter at output position p. Over the N·HO·WO positions its mean and
// (biased) variance are therefore a linear and a quadratic form in the patches' mean m and covariance Σ:
//     mean_c = w_c · m + bias_c,        var_c = w_cᵀ Σ w_c.
// m (K values) and Σ (K×K) come from the input alone, so the statistics need no convolution and no output.
//
// Σ[(i,a),(j,b)] = Σ_p x_i(p+a)·x_j(p+b) depends on the offsets a, b ∈ [0,3)² only through the lag d = b − a,
// except near the border: with q = p + a it is the sum of Z(q) = x_i(q)·x_j(q+d) over the window
// [a1, a1+HO) × [a2, a2+WO), which is the whole image minus at most two rows and two columns. So
//   * the main kernel sums Z over the whole image, once per (i, j, d): 8·8·15 lags (d1 ∈ [0,2], d2 ∈ [−2,2];
//     d1 < 0 follows from symmetry) instead of 72·72 patch products per position — by FFMA
//     (moments_main_kernel) or, for each lag a Gram product, on the tensor cores (moments_tc_kernel, 3xTF32);
//   * the edge kernel sums Z along rows {0, 1, H−2, H−1} and columns {0, 1, W−2, W−1}, and the 16 corners;
//   * the cov kernel forms each window's sum by inclusion–exclusion, then m and Σ (in double);
//   * the fold kernel computes mean_c and var_c, updates the running statistics as nn.BatchNorm2d does, and
//     folds BN and the scale into the weights (the finalize and the update are bn_stats.cuh's, shared with
//     chapter 1 and the in-place path): with a_c = γ_c·(1/√(var_c+ε))·s,
//     w'_c = w_c·a_c, b'_c = (bias_c − mean_c)·a_c + β_c·s.
// The convolution then runs once, on w', b' (the eval kernel), and writes the final output.
//
// Numerics (chapter 5): the covariance is invariant to shifting each input channel, so every value is read as
// x − p_i (a per-channel pivot: the mean of 16 values of channel i on a 4×4 grid over the first sample, so one
// outlying pixel moves it by a sixteenth of its size) before it is multiplied; the first moments use a constant
// channel 1 (index CI_MAX) on the same machinery. Products are summed in fp32 over one tile (≤ 16·8 per lane,
// then 16 lanes; on the tensor cores 8 per mma, 32 rows per lane, then 8 warps), and the tiles' sums in double.
// What this cannot avoid: var_c = w_cᵀΣw_c cancels when the filter is nearly orthogonal to the input's
// variation (a difference filter on smooth inputs); then the in-place strategy, which reduces the output
// itself, is the safe one.
//
// The guard (strategy "auto") predicts the moments path's output error and compares it with the float32
// library's. The sums are of pivot-shifted values, so each entry of Σ errs relative to the second moment about
// the pivot, S = Σ + m·mᵀ (m = the patch mean of x − p). If every entry erred by u in the same direction, var_c
// would err by u·κ_c, κ_c = |w_c|ᵀ|S||w_c| / w_cᵀΣw_c (the bound); the roundings of different sums are
// independent, and the error measured on the GPU follows their root-sum-square,
//     rel. error of var_c ≈ u·√(a² + (c·ρ_c)²),   ρ_c = ‖(w_c w_cᵀ) ∘ S‖_F / w_cᵀΣw_c  (ρ_c ≤ κ_c),
// a the sums' floor and c their spread (GuardModel: measured, see moments_fold). A relative error δ_c of var_c
// scales channel c's normalised output by δ_c/2, and the channel weighs in ‖y‖² as (γ_c·s)², so the predicted
// norm-wise error is E = ½·u·√(Σ_c (γ_c s)²·r_c³·(a² + c²ρ_c²) / Σ_c ((γ_c s)²·r_c + (β_c s)²)), r_c the
// share var_c / (var_c + ε) (ε damps the error). The library's own error on a K-term dot product is about
// u·√K (K = C_in·9); "float32-accurate" allows twice it, and the folded convolution spends about one of the
// two in quadrature, so the moments are taken while E ≤ √3·u·√K. A 3xTF32 output convolution adds its own
// rounding, which scales with |w·x| rather than with the output: a split product errs about CONV_TF32_UNIT·u of
// |w_ck·x_k| at random, so channel c's output errs u·CONV_TF32_UNIT·√Q_c, Q_c = Σ_k w_ck²·E[x_k²], and its
// normalised output (γ_c s)²·Q_c/(σ_c²+ε) in square — large where the products cancel. While √(E² + E_conv²)
// stays within the allowance the convolution runs on the tensor cores; otherwise the moments' statistics are
// kept and the convolution runs by FFMA (flag 2), which errs as the library's. The fold kernel already holds Σ, m
// and w_c:
// each block adds its channel's terms in double, the last block to arrive compares and sets a flag in device
// memory: 0 the moments, 2 the moments with the FFMA convolution, 1 in place. The launches that follow read the
// flag and each exits at once unless it selects it: either the running statistics staged by the fold are
// committed and the folded convolution (on the tensor cores, or by FFMA) writes the output, or the in-place
// strategy runs. No host synchronisation; the running statistics are updated by exactly one path.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "bn_stats.cuh"
#include "tf32.cuh"

namespace cbm {

constexpr int K3 = 3;
constexpr int CI_MAX = 8;                      // input channels supported (accumulators per thread: CI_MAX × ND)
constexpr int NJ = CI_MAX + 1;                 // partner channels: the inputs, and the constant 1 (index CI_MAX)
constexpr int ND = 5;                          // column lags d2 = −2..2
constexpr int D1 = 3;                          // row lags d1 = 0..2 (negative ones by symmetry)
constexpr int COMBOS = CI_MAX * NJ * D1 * ND;  // 1,080 (i, j, d1, d2)
constexpr int SLOTS = 25;                      // per combo: image total, 4 border rows, 4 border columns, 4×4 corners
constexpr int ACC_DOUBLES = COMBOS * SLOTS;    // 27,000 doubles (216 KB) of workspace
constexpr int KMAX = CI_MAX * K3 * K3;         // 72 patch values
constexpr double U32 = 5.9604644775390625e-8;  // u = 2^-24, the unit roundoff of float32
// The guard's model of the moments' variance error, rel. error ≈ u·√(floor² + (spread·ρ_c)²) per channel: the
// smallest floor and spread that cover the rms over channels in each of 40 cases measured on an H200 (P73's data,
// natural images with classic and random filters, smooth fields, outlying pivots: 2,560 channels per
// arithmetic). Per channel the error scatters about this rms; the guard uses it only summed over channels.
struct GuardModel {
    double floor, spread;
};
constexpr GuardModel GUARD_FFMA{2.0, 1.25};  // FFMA sums: floor 0.53u measured (cases of ρ ≤ 1), spread ≤ 1.19
constexpr GuardModel GUARD_TF32{4.0, 2.0};   // 3xTF32 sums: floor 3.1u measured, spread ≤ 1.98
// The float32 library's error is taken as u·√K for its K = C_in·9-term dot products (the probabilistic estimate
// of their rounding): on P73's shape it measured 0.65–1.2× that (eager PyTorch, TF32 off, 12 input/filter
// pairs at the benchmark's batch). "Float32-accurate" allows twice the library's error; our folded convolution
// errs about as the library's does and adds in quadrature, so the statistics may add √(2² − 1) = √3 times it.
constexpr double GUARD_ALLOWANCE = 1.7320508075688772;
// A 3xTF32 product's error as a standard deviation, in units of u of |w·x|: the split emulated on the CPU (hi
// rounded, the input's lo truncated by the tensor core, lo·lo dropped) errs 1.2–1.3u rms on uniform, normal and
// log-normal operands; 2 leaves a margin for the tensor core's truncating accumulation, which that leaves out.
// On the natural images' Sobel filter the moments on the tensor cores measured an output error that bounds it
// at 1.3u (guard_study.split_product_error, and chapter 7's record).
constexpr double CONV_TF32_UNIT = 2.0;
// The guard's flag: the path strategy "auto" takes.
constexpr unsigned FLAG_MOMENTS = 0u, FLAG_INPLACE = 1u, FLAG_MOMENTS_FFMA_CONV = 2u;

// Main kernel: one tile = one sample × BAND rows × TCOLS columns; a work item (i, group of JG partner channels
// j) is half a warp, each lane a strip of STRIP columns; 16 items = 256 threads. A lane walks the partner rows ρ
// and keeps the rows ρ, ρ−1, ρ−2 of x_i in registers: each partner row read from shared memory feeds all three
// row lags (3·5·8 = 120 FMAs per 16 floats read), so the kernel is bound by FMAs, not by shared-memory reads.
constexpr int STRIP = 8;
constexpr int LANES = 16;
constexpr int TCOLS = STRIP * LANES;           // 128
constexpr int JG = 4;                          // partner channels per thread (60 accumulators: 3 d1 × 4 j × 5 d2)
constexpr int ITEMS = CI_MAX * (CI_MAX / JG);  // 16
constexpr int THREADS = ITEMS * LANES;         // 256
constexpr int COLS = TCOLS + 8;                // staged columns c0−4 .. c0+131 (lags reach ±2, float4 granules)
constexpr int PITCH = COLS + 4 * ((COLS + 31) / 32);  // 156: 4 floats of padding after every 32 columns
static_assert(COLS % 4 == 0, "rows are staged as float4s");
// Rows per tile: 16 where 89,856 B of shared memory fit a block (sm_80, sm_86+, sm_90), 8 (49,920 B) on sm_75.
// Each tile ends with a 16-lane reduction and atomics: 16 rows halve that overhead.
template <int BAND>
constexpr int smem_bytes() { return CI_MAX * (BAND + D1 - 1) * PITCH * 4; }
static_assert(PITCH % 4 == 0, "float4 reads need a pitch that is a multiple of 4");

// Staged column cc (0 = image column c0−4) → its float offset in a row. A lane reads its 8 (xi) or 16 (xj)
// consecutive columns as float4s; without the padding lanes 0 and 4 of a quarter-warp would hit the same banks.
__device__ __forceinline__ int spos(int cc) { return cc + 4 * (cc >> 5); }

__device__ __forceinline__ int combo(int i, int j, int d1, int d2i) { return ((i * NJ + j) * D1 + d1) * ND + d2i; }

struct MShape {
    int N, C, H, W;        // input (N, C, H, W), C ≤ CI_MAX
    int row_tiles, col_tiles;
    int64_t tiles;         // N · row_tiles · col_tiles
    bool vec4;             // W % 4 == 0 and x 16-byte aligned: stage with float4 loads
};

// Channel ch's pivot: the mean of its 16 values on a 4×4 grid over sample 0, summed in one fixed order, so every
// kernel that reads it gets the same float.
__device__ __forceinline__ float pivot(const float* __restrict__ x, int H, int W, int ch) {
    const float* plane = x + static_cast<int64_t>(ch) * H * W;
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) sum += __ldg(plane + static_cast<int64_t>(i * (H - 1) / 3) * W + j * (W - 1) / 3);
    return sum * 0.0625f;
}
__device__ __forceinline__ float pivot(const float* __restrict__ x, const MShape& s, int ch) {
    return pivot(x, s.H, s.W, ch);
}

__device__ __forceinline__ bool inside(const MShape& s, int r, int c) { return r >= 0 && r < s.H && c >= 0 && c < s.W; }

// Stage rows rb .. rb+SROWS−1 of channels 0 .. chans−1, columns c0−4 .. c0+131, each pivot-shifted, at
// sm[ch·cstride + rr·pitch + column], the column padded by spos (kPad) or not; zero outside the image and for
// channels ≥ s.C (a product with a missing neighbour adds nothing). Rows of a multiple of 4 floats in 16-byte
// aligned memory move as float4s (all 4 inside or all outside the image: c0 − 4 is a multiple of 4), 2 loads in
// flight per thread (more would spill: the FFMA kernel's compute holds 80 registers).
template <int SROWS, bool kPad>
__device__ __forceinline__ void stage(float* sm, const float* __restrict__ x, const MShape& s, const float* piv,
                                      int n, int rb, int c0, int chans, int cstride, int pitch) {
    const auto src = [&](int ch, int r, int c) {
        return x + ((static_cast<int64_t>(n) * s.C + ch) * s.H + r) * s.W + c;
    };
    if (s.vec4) {
        constexpr int Q = COLS / 4;
#pragma unroll 2
        for (int e = threadIdx.x; e < chans * SROWS * Q; e += blockDim.x) {
            const int ch = e / (SROWS * Q), rr = e / Q % SROWS, q = e % Q;
            const int r = rb + rr, c = c0 - 4 + 4 * q;
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (ch < s.C && inside(s, r, c)) {
                v = __ldg(reinterpret_cast<const float4*>(src(ch, r, c)));
                const float p = piv[ch];
                v.x -= p; v.y -= p; v.z -= p; v.w -= p;
            }
            *reinterpret_cast<float4*>(sm + ch * cstride + rr * pitch + (kPad ? spos(4 * q) : 4 * q)) = v;
        }
    } else {
#pragma unroll 2
        for (int e = threadIdx.x; e < chans * SROWS * COLS; e += blockDim.x) {
            const int ch = e / (SROWS * COLS), rr = e / COLS % SROWS, cc = e % COLS;
            const int r = rb + rr, c = c0 - 4 + cc;
            sm[ch * cstride + rr * pitch + (kPad ? spos(cc) : cc)] =
                ch < s.C && inside(s, r, c) ? __ldg(src(ch, r, c)) - piv[ch] : 0.f;
        }
    }
}

// Σ_q Z(q) over the whole image for every (i, j < C, d1, d2) and Σ_q x_i(q): acc[combo·SLOTS].
template <int BAND>
__global__ void __launch_bounds__(THREADS, 2)
moments_main_kernel(const float* __restrict__ x, MShape s, double* __restrict__ acc) {
    extern __shared__ float4 smem4[];
    float* sm = reinterpret_cast<float*>(smem4);
    __shared__ float piv[CI_MAX];
    if (threadIdx.x < CI_MAX) piv[threadIdx.x] = threadIdx.x < s.C ? pivot(x, s, threadIdx.x) : 0.f;
    const int item = threadIdx.x / LANES, lane = threadIdx.x % LANES;
    const int i = item / (CI_MAX / JG), j0 = item % (CI_MAX / JG) * JG;
    const bool active = i < s.C && j0 < s.C;
    constexpr int SROWS = BAND + D1 - 1;  // staged rows r0 .. r0+BAND+1
    const int per_sample = s.row_tiles * s.col_tiles;

    for (int64_t tile = blockIdx.x; tile < s.tiles; tile += gridDim.x) {
        const int n = static_cast<int>(tile / per_sample);
        const int rest = static_cast<int>(tile % per_sample);
        const int r0 = (rest / s.col_tiles) * BAND, c0 = (rest % s.col_tiles) * TCOLS;
        __syncthreads();  // the previous tile's reads are done (and piv is written)
        stage<SROWS, true>(sm, x, s, piv, n, r0, c0, s.C, SROWS * PITCH, PITCH);  // x_i's rows, 2 more below
        __syncthreads();

        float a[D1][JG][ND];
#pragma unroll
        for (int l = 0; l < D1; ++l)
#pragma unroll
            for (int j = 0; j < JG; ++j)
#pragma unroll
                for (int d = 0; d < ND; ++d) a[l][j][d] = 0.f;
        float a1 = 0.f;  // Σ x_i (first moments), by the items of the first partner group
        // excerpt: lags
        if (active) {
            const int rows = min(BAND, s.H - r0);  // rows of x_i this tile owns
            float xi[D1][STRIP];                   // x_i rows ρ, ρ−1, ρ−2 (zero outside the owned rows)
#pragma unroll
            for (int l = 0; l < D1; ++l)
#pragma unroll
                for (int t = 0; t < STRIP; ++t) xi[l][t] = 0.f;
            for (int rho = 0; rho < rows + D1 - 1; ++rho) {
#pragma unroll
                for (int t = 0; t < STRIP; ++t) { xi[2][t] = xi[1][t]; xi[1][t] = xi[0][t]; xi[0][t] = 0.f; }
                if (rho < rows) {
                    const float* pi = sm + (i * SROWS + rho) * PITCH;
                    const float4 u0 = *reinterpret_cast<const float4*>(pi + spos(lane * STRIP + 4));
                    const float4 u1 = *reinterpret_cast<const float4*>(pi + spos(lane * STRIP + 8));
                    xi[0][0] = u0.x; xi[0][1] = u0.y; xi[0][2] = u0.z; xi[0][3] = u0.w;
                    xi[0][4] = u1.x; xi[0][5] = u1.y; xi[0][6] = u1.z; xi[0][7] = u1.w;
                    if (j0 == 0) a1 += ((u0.x + u0.y) + (u0.z + u0.w)) + ((u1.x + u1.y) + (u1.z + u1.w));
                }
#pragma unroll
                for (int jj = 0; jj < JG; ++jj) {
                    if (j0 + jj >= s.C) break;
                    const float* pj = sm + ((j0 + jj) * SROWS + rho) * PITCH;
                    float xj[16];  // columns c0 + lane·8 − 4 .. + 11
#pragma unroll
                    for (int k = 0; k < 4; ++k) {
                        const float4 v = *reinterpret_cast<const float4*>(pj + spos(lane * STRIP + 4 * k));
                        xj[4 * k] = v.x; xj[4 * k + 1] = v.y; xj[4 * k + 2] = v.z; xj[4 * k + 3] = v.w;
                    }
#pragma unroll
                    for (int l = 0; l < D1; ++l)  // x_i row ρ − l pairs with x_j row ρ at row lag l
#pragma unroll
                        for (int d = 0; d < ND; ++d)
#pragma unroll
                            for (int t = 0; t < STRIP; ++t)
                                a[l][jj][d] = fmaf(xi[l][t], xj[t + d + 2], a[l][jj][d]);
                }
            }
        }
        // end excerpt: lags
        // Sum over the 16 lanes of each item (xor offsets < 16 stay inside the half-warp; every lane takes part).
#pragma unroll
        for (int l = 0; l < D1; ++l)
#pragma unroll
            for (int j = 0; j < JG; ++j)
#pragma unroll
                for (int d = 0; d < ND; ++d)
#pragma unroll
                    for (int o = LANES / 2; o > 0; o >>= 1)
                        a[l][j][d] += __shfl_xor_sync(0xffffffffu, a[l][j][d], o);
#pragma unroll
        for (int o = LANES / 2; o > 0; o >>= 1) a1 += __shfl_xor_sync(0xffffffffu, a1, o);
        if (active && lane == 0) {
#pragma unroll
            for (int jj = 0; jj < JG; ++jj) {
                if (j0 + jj >= s.C) break;
#pragma unroll
                for (int l = 0; l < D1; ++l)
#pragma unroll
                    for (int d = 0; d < ND; ++d)
                        atomicAdd(acc + combo(i, j0 + jj, l, d) * SLOTS, static_cast<double>(a[l][jj][d]));
            }
            if (j0 == 0) atomicAdd(acc + combo(i, CI_MAX, 0, 2) * SLOTS, static_cast<double>(a1));
        }
    }
}

// The same sums on the tensor cores (3xTF32, tf32.cuh; sm_80 or newer). For one lag d = (d1, d2) they are a Gram
// product over positions: G_d[i][j] = Σ_q x_i(q − d)·x_j(q). An mma.sync.m16n8k8 takes 8 consecutive columns of
// one row as its depth: B = x_j at those positions (8 partner channels, N = 8), A = x_i at the same positions
// shifted back by the lag, two lags stacked (M = 16: rows (lag, i)). So the 15 lags are 8 mma tiles (the 16th
// row block zero) sharing one B fragment, and a lag is only an offset into the staged rows: no im2col. Lane
// (g, t) needs channel g at three rows (ρ, ρ − 1, ρ − 2) and nine columns (c + t − 2 … c + t + 6); a warp walks
// down the rows of an 8-column chunk and keeps the three rows split into TF32 (hi, lo) in registers, so each value
// is loaded and split once per chunk and serves 15 lags. The tile owns the positions of x_j (rows r0 … r0+15);
// x_i is staged from two rows above. The first moments are summed from the staged rows (a warp per channel).
constexpr int T_BAND = 16;                      // rows per tile
constexpr int T_SROWS = T_BAND + D1 - 1;        // staged rows r0 − 2 … r0 + 15
constexpr int T_PITCH = COLS;                   // 136 floats per staged row (c0 − 4 … c0 + 131)
constexpr int T_CSTRIDE = T_SROWS * T_PITCH + 20;  // 2,468 ≡ 4 (mod 32): lanes (g, t) hit banks 4g + t, all 32
constexpr int T_LAGS = D1 * ND;                 // 15 lags λ = 5·d1 + d2 + 2
constexpr int T_MT = (T_LAGS + 1) / 2;          // 8 mma tiles, lags 2m and 2m + 1

constexpr int TG = 4;                           // mma tiles in flight per row (4 independent chains)
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 860 || __CUDA_ARCH__ == 870 || __CUDA_ARCH__ == 890)
constexpr int T_MIN_BLOCKS = 1;  // ≈ 100 KB of shared memory per SM: one block fits anyway; no register cap
#else
constexpr int T_MIN_BLOCKS = 2;  // 2 blocks per SM: 128 registers (1 block at 166 registers was slower on the H200)
#endif
constexpr int T_WARPS = 8, T_THREADS = 32 * T_WARPS;
constexpr int T_CHUNKS = TCOLS / 8 / T_WARPS;   // 2 chunks of 8 columns per warp
constexpr int T_SMEM = CI_MAX * T_CSTRIDE * 4;  // 78,976 B
static_assert(T_CSTRIDE % 32 == 4 && T_CSTRIDE % 4 == 0 && T_CSTRIDE >= T_SROWS * T_PITCH, "banks, float4 rows");
static_assert(T_WARPS * 32 * 4 * T_MT + CI_MAX <= CI_MAX * T_CSTRIDE, "the warps' sums fit the staging buffer");
static_assert(T_WARPS == CI_MAX, "the first moments: one warp per input channel");

// Nine values of channel g (one staged row, columns c + t − 2 … c + t + 6) into window slot P, split.
template <int P>
__device__ __forceinline__ void load_row(uint32_t (&hi)[3][9], uint32_t (&lo)[3][9], const float* row) {
#pragma unroll
    for (int o = 0; o < 9; ++o) kb::split_fast(row[o], hi[P][o], lo[P][o]);
}

// excerpt: gram
// One partner row ρ of an 8-column chunk: acc[m] += the 16 × 8 tile of lags 2m, 2m + 1 (rows: lag, i; columns: j).
// Window slot l holds row ρ − l (row ρ is loaded here); lag (d1, d2) reads x_i at row ρ − d1, column offset −d2:
// slot d1, entries 2 − d2 and 6 − d2. B is x_j at offsets 0 and 4: slot 0, entries 2 and 6.
__device__ __forceinline__ void gram_row(float (&acc)[T_MT][4], uint32_t (&hi)[3][9], uint32_t (&lo)[3][9],
                                         const float* row) {
    load_row<0>(hi, lo, row);
    const uint32_t b_hi[2] = {hi[0][2], hi[0][6]}, b_lo[2] = {lo[0][2], lo[0][6]};
#pragma unroll
    for (int half = 0; half < T_MT / TG; ++half) {  // TG tiles at a time: TG independent mma chains
        float step[TG][4];
        uint32_t a_hi[TG][4], a_lo[TG][4];
#pragma unroll
        for (int k = 0; k < TG; ++k) {
            const int m = TG * half + k, la = 2 * m, lb = 2 * m + 1;
            const int sa = la / ND, oa = 4 - la % ND, sb = lb / ND % D1, ob = 4 - lb % ND;
            const bool pad = lb >= T_LAGS;  // the 16th lag row block: zeros
            a_hi[k][0] = hi[sa][oa], a_hi[k][1] = pad ? 0u : hi[sb][ob];
            a_hi[k][2] = hi[sa][oa + 4], a_hi[k][3] = pad ? 0u : hi[sb][ob + 4];
            a_lo[k][0] = lo[sa][oa], a_lo[k][1] = pad ? 0u : lo[sb][ob];
            a_lo[k][2] = lo[sa][oa + 4], a_lo[k][3] = pad ? 0u : lo[sb][ob + 4];
        }
#pragma unroll
        for (int k = 0; k < TG; ++k) kb::mma0(step[k], a_lo[k], b_hi);  // small terms first, from zero
#pragma unroll
        for (int k = 0; k < TG; ++k) kb::mma(step[k], a_hi[k], b_lo);
#pragma unroll
        for (int k = 0; k < TG; ++k) kb::mma(step[k], a_hi[k], b_hi);
#pragma unroll
        for (int k = 0; k < TG; ++k)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[TG * half + k][e] += step[k][e];  // the row joins, rounded
    }
}
// end excerpt: gram

__global__ void __launch_bounds__(T_THREADS, T_MIN_BLOCKS)
moments_tc_kernel(const float* __restrict__ x, MShape s, double* __restrict__ acc) {
    extern __shared__ float4 smem4[];
    float* sm = reinterpret_cast<float*>(smem4);
    __shared__ float piv[CI_MAX];
    if (threadIdx.x < CI_MAX) piv[threadIdx.x] = threadIdx.x < s.C ? pivot(x, s, threadIdx.x) : 0.f;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int per_sample = s.row_tiles * s.col_tiles;

    for (int tile = blockIdx.x; tile < s.tiles; tile += gridDim.x) {  // s.tiles < 2^31 (moments_fold checks)
        const int n = static_cast<int>(tile / per_sample);
        const int rest = static_cast<int>(tile % per_sample);
        const int r0 = (rest / s.col_tiles) * T_BAND, c0 = (rest % s.col_tiles) * TCOLS;
        __syncthreads();  // the previous tile's sums are read (and piv is written)
        stage<T_SROWS, false>(sm, x, s, piv, n, r0 - (D1 - 1), c0, CI_MAX, T_CSTRIDE, T_PITCH);
        __syncthreads();

        float sums[T_MT][4] = {};
        const int rows = min(T_BAND, s.H - r0);
#pragma unroll 1
        for (int chunk = 0; chunk < T_CHUNKS; ++chunk) {
            // Channel g, staged column c + t + 2 + o = image column c0 + c + t − 2 + o (o = 0 … 8).
            const float* base = sm + g * T_CSTRIDE + 8 * (warp + T_WARPS * chunk) + t + 2;
            uint32_t hi[3][9], lo[3][9];
            load_row<2>(hi, lo, base);            // row r0 − 2: ρ − 2 for the first ρ
            load_row<1>(hi, lo, base + T_PITCH);  // row r0 − 1
#pragma unroll 1
            for (int rr = 0; rr < rows; ++rr) {  // staged row rr + 2 is image row r0 + rr
                gram_row(sums, hi, lo, base + (rr + 2) * T_PITCH);
#pragma unroll
                for (int o = 0; o < 9; ++o) {  // slide down: 36 moves (rotating the slots instead spilled)
                    hi[2][o] = hi[1][o], lo[2][o] = lo[1][o];
                    hi[1][o] = hi[0][o], lo[1][o] = lo[0][o];
                }
            }
        }
        // The first moments: warp w sums channel w's owned rows (staged rows 2 … rows + 1, columns 4 … 131).
        float s1 = 0.f;
        for (int e = lane; e < rows * (TCOLS / 4); e += 32) {
            const float4 v = *reinterpret_cast<const float4*>(sm + warp * T_CSTRIDE + (e / (TCOLS / 4) + 2) * T_PITCH +
                                                              4 + 4 * (e % (TCOLS / 4)));
            s1 += (v.x + v.y) + (v.z + v.w);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s1 += __shfl_xor_sync(0xffffffffu, s1, o);
        // Lane (g, t) holds, for tile m, (lag 2m, i = g) and (lag 2m + 1, i = g) × (j = 2t, 2t + 1). The 8 warps'
        // sums go through shared memory ([warp][entry][lane], conflict-free both ways), then into double.
        __syncthreads();  // every warp is done with the staged rows
        float* red = sm;
#pragma unroll
        for (int m = 0; m < T_MT; ++m)
#pragma unroll
            for (int e = 0; e < 4; ++e) red[(warp * T_MT * 4 + m * 4 + e) * 32 + lane] = sums[m][e];
        if (lane == 0) red[T_WARPS * T_MT * 128 + warp] = s1;
        __syncthreads();
        for (int id = threadIdx.x; id < T_MT * 128; id += T_THREADS) {
            const int m = id / 128, e = id / 32 % 4, ln = id % 32;
            const int lag = 2 * m + (e >> 1), i = ln >> 2, j = 2 * (ln & 3) + (e & 1);
            if (lag >= T_LAGS || i >= s.C || j >= s.C) continue;
            float z = 0.f;
#pragma unroll
            for (int w = 0; w < T_WARPS; ++w) z += red[w * T_MT * 128 + id];
            atomicAdd(acc + combo(i, j, lag / ND, lag % ND) * SLOTS, static_cast<double>(z));
        }
        if (threadIdx.x < s.C)
            atomicAdd(acc + combo(threadIdx.x, CI_MAX, 0, 2) * SLOTS,
                      static_cast<double>(red[T_WARPS * T_MT * 128 + threadIdx.x]));
    }
}

// The border terms: one block per (sample, side). Sides 0 and 1 are the row pairs {0, 1} and {H−2, H−1}
// (Σ over all columns → slots 1–4); sides 2 and 3 the column pairs {0, 1} and {W−2, W−1} (Σ over all rows →
// slots 5–8, and the corners, where such a column crosses a border row → slots 9–24). A thread per
// (i, j, d1) keeps the five d2 lags; lines are staged in chunks of E_CHUNK positions, so any H and W fit.
constexpr int E_THREADS = 256;
constexpr int E_CHUNK = 128;
constexpr int E_COMBOS = CI_MAX * NJ * D1;  // 216 (i, j, d1)
constexpr int E_ROWS_PITCH = E_CHUNK + 4;   // row sides: 4 rows × (chunk + 2 columns each side)
constexpr int E_COLS_W = 6;                 // column sides: 6 columns (the pair ± 2)
constexpr int E_SMEM_FLOATS = NJ * (E_CHUNK + 2) * E_COLS_W;  // ≥ NJ · 4 · E_ROWS_PITCH; the ones channel staged
static_assert(E_COMBOS <= E_THREADS, "a thread per (i, j, d1)");
static_assert(NJ * 4 * E_ROWS_PITCH <= E_SMEM_FLOATS, "the row sides' staging fits the buffer");

// Channel ch (the ones channel for ch = C: 1 inside the image), pivot-shifted, at (r, c) of sample xn; 0 outside.
__device__ __forceinline__ float edge_value(const float* __restrict__ xn, const MShape& s, const float* piv, int ch,
                                            int r, int c) {
    if (!inside(s, r, c)) return 0.f;
    if (ch == s.C) return 1.f;
    return __ldg(xn + (static_cast<int64_t>(ch) * s.H + r) * s.W + c) - piv[ch];
}

__global__ void __launch_bounds__(E_THREADS) moments_edge_kernel(const float* __restrict__ x, MShape s,
                                                                 double* __restrict__ acc) {
    __shared__ float buf[E_SMEM_FLOATS];
    __shared__ float piv[CI_MAX];
    const int n = blockIdx.x, side = blockIdx.y;
    if (threadIdx.x < CI_MAX) piv[threadIdx.x] = threadIdx.x < s.C ? pivot(x, s, threadIdx.x) : 0.f;
    const int t = threadIdx.x, d1 = t % D1, jc = t / D1 % NJ, i = t / (D1 * NJ);
    const bool valid = t < E_COMBOS && i < s.C && (jc < s.C || jc == CI_MAX) && (jc < CI_MAX || d1 == 0);
    const int j = jc == CI_MAX ? s.C : jc;  // staged channel index: the ones channel follows the inputs
    const int staged = s.C + 1;
    const float* xn = x + static_cast<int64_t>(n) * s.C * s.H * s.W;
    float sum[2][ND] = {};
    if (side < 2) {
        const int rb = side == 0 ? 0 : s.H - 2;  // lines rb, rb + 1; partners up to rb + 3
        for (int cb = 0; cb < s.W; cb += E_CHUNK) {
            __syncthreads();  // piv written; the previous chunk's reads done
#pragma unroll 4  // independent loads in flight: the column sides' loads are one per row, latency-bound
            for (int e = threadIdx.x; e < staged * 4 * E_ROWS_PITCH; e += E_THREADS) {
                const int ch = e / (4 * E_ROWS_PITCH), rr = e / E_ROWS_PITCH % 4, cc = e % E_ROWS_PITCH;
                buf[e] = edge_value(xn, s, piv, ch, rb + rr, cb - 2 + cc);
            }
            __syncthreads();
            if (valid) {
                const int len = min(E_CHUNK, s.W - cb);
#pragma unroll
                for (int rl = 0; rl < 2; ++rl) {
                    const float* pi = buf + (i * 4 + rl) * E_ROWS_PITCH + 2;
                    const float* pj = buf + (j * 4 + rl + d1) * E_ROWS_PITCH;
                    float win[ND] = {0.f, pj[0], pj[1], pj[2], pj[3]};  // x_j at c − 2 .. c + 2, slid along
                    for (int c = 0; c < len; ++c) {
#pragma unroll
                        for (int d = 0; d < ND - 1; ++d) win[d] = win[d + 1];
                        win[ND - 1] = pj[c + 4];
                        const float xi = pi[c];
#pragma unroll
                        for (int d = 0; d < ND; ++d) sum[rl][d] = fmaf(xi, win[d], sum[rl][d]);
                    }
                }
            }
        }
        if (valid) {
#pragma unroll
            for (int rl = 0; rl < 2; ++rl)
#pragma unroll
                for (int d = 0; d < ND; ++d)
                    atomicAdd(acc + combo(i, jc, d1, d) * SLOTS + 1 + 2 * side + rl, static_cast<double>(sum[rl][d]));
        }
        return;
    }
    const int cb = side == 2 ? 0 : s.W - 2;  // lines cb, cb + 1; partners cb − 2 .. cb + 3
    const int kc = 2 * (side - 2);           // their column slots kc, kc + 1
    for (int rc = 0; rc < s.H; rc += E_CHUNK) {
        __syncthreads();
#pragma unroll 4
        for (int e = threadIdx.x; e < staged * (E_CHUNK + 2) * E_COLS_W; e += E_THREADS) {
            const int ch = e / ((E_CHUNK + 2) * E_COLS_W), rr = e / E_COLS_W % (E_CHUNK + 2), cc = e % E_COLS_W;
            buf[e] = edge_value(xn, s, piv, ch, rc + rr, cb - 2 + cc);
        }
        __syncthreads();
        if (!valid) continue;
        const int len = min(E_CHUNK, s.H - rc);
        for (int r = 0; r < len; ++r) {
            const int row = rc + r;
            const float* pi = buf + (i * (E_CHUNK + 2) + r) * E_COLS_W + 2;
            const float* pj = buf + (j * (E_CHUNK + 2) + r + d1) * E_COLS_W;
            const bool border_row = row < 2 || row >= s.H - 2;
#pragma unroll
            for (int cl = 0; cl < 2; ++cl) {
                const float xi = pi[cl];
                float z[ND];
#pragma unroll
                for (int d = 0; d < ND; ++d) {
                    z[d] = xi * pj[cl + d];
                    sum[cl][d] += z[d];
                }
                if (!border_row) continue;
#pragma unroll
                for (int kr = 0; kr < 4; ++kr) {  // the product is also a corner (slots repeat when H < 4)
                    if (row != (kr < 2 ? kr : s.H - 4 + kr)) continue;
#pragma unroll
                    for (int d = 0; d < ND; ++d)
                        atomicAdd(acc + combo(i, jc, d1, d) * SLOTS + 9 + kr * 4 + kc + cl, static_cast<double>(z[d]));
                }
            }
        }
    }
    if (valid) {
#pragma unroll
        for (int cl = 0; cl < 2; ++cl)
#pragma unroll
            for (int d = 0; d < ND; ++d)
                atomicAdd(acc + combo(i, jc, d1, d) * SLOTS + 5 + kc + cl, static_cast<double>(sum[cl][d]));
    }
}

// Σ of Z over the window [a1, a1+HO) × [a2, a2+WO): the image minus the two rows and two columns outside it,
// plus the four corners subtracted twice. Outside rows by window: a1 = 0 → {H−2, H−1} (slots 2, 3),
// a1 = 1 → {0, H−1} (0, 3), a1 = 2 → {0, 1} (0, 1); columns alike.
__device__ __forceinline__ double window_sum(const double* __restrict__ acc, int cmb, int a1, int a2) {
    const double* p = acc + cmb * SLOTS;
    const int ra = a1 == 0 ? 2 : 0, rb = a1 == 2 ? 1 : 3;
    const int ca = a2 == 0 ? 2 : 0, cb = a2 == 2 ? 1 : 3;
    return p[0] - p[1 + ra] - p[1 + rb] - p[5 + ca] - p[5 + cb] + p[9 + ra * 4 + ca] + p[9 + ra * 4 + cb] +
           p[9 + rb * 4 + ca] + p[9 + rb * 4 + cb];
}

struct Finalize {
    const float* w;        // conv weight (C_out, C, 3, 3)
    const float* bias;     // conv bias or null
    const float* gamma;    // BN weight or null
    const float* beta;     // BN bias or null
    float* running_mean;   // null when not tracking
    float* running_var;
    int64_t* num_batches_tracked;
    float* w_fold;         // out: (C_out, C, 3, 3)
    float* b_fold;         // out: (C_out)
    unsigned* guard;       // "auto": [0] the path (FLAG_*), set by the last fold block; null: no guard
    double* risk;          // "auto": the workspace's RISK_SLOTS doubles (the prediction); null with guard null
    float* staged;         // "auto": [2·C_out] new running mean, var (moments_commit_kernel); null: in place
    int C_out;
    float momentum;        // < 0: None (cumulative average)
    float eps, scale;
    GuardModel model = GUARD_FFMA;  // the sums' error model (GUARD_TF32 for moments_tc_kernel's)
    bool tc_conv = false;           // the folded convolution would run on the tensor cores (3xTF32)
};

// Workspace after the sums: the patch covariance (KMAX² doubles), the patch mean (KMAX), the running-average
// weight (1), the guard's two counters (one double: the flag, then the in-place path's block arrivals), and the
// guard's prediction (RISK_*: its three sums over channels, the fold's block arrivals, the statistics' predicted
// error, the allowance it was compared with, and the tensor-core convolution's predicted error).
constexpr int COV_OFFSET = ACC_DOUBLES;
constexpr int MEAN_OFFSET = COV_OFFSET + KMAX * KMAX;
constexpr int FACTOR_OFFSET = MEAN_OFFSET + KMAX;
constexpr int GUARD_OFFSET = FACTOR_OFFSET + 1;
constexpr int RISK_OFFSET = GUARD_OFFSET + 1;
constexpr int RISK_NUM = 0, RISK_DEN = 1, RISK_CONV = 2, RISK_ARRIVALS = 3, RISK_PREDICTED = 4, RISK_ALLOWED = 5,
              RISK_PREDICTED_CONV = 6, RISK_SLOTS = 7;
constexpr int WORKSPACE_DOUBLES = RISK_OFFSET + RISK_SLOTS;

// The allowance the guard compares its predicted output error with, for K = C_in·9 (see GuardModel).
__host__ __device__ __forceinline__ double guard_allowance(int K) { return GUARD_ALLOWANCE * U32 * sqrt(double(K)); }

__device__ __forceinline__ double patch_mean(const double* __restrict__ acc, int u, double M) {
    return window_sum(acc, combo(u / 9, CI_MAX, 0, 2), u % 9 / 3, u % 3) / M;
}

// Block u (of K = C·9): row u of the patch covariance, and the patch mean; block 0 also the running-average
// weight, read before num_batches_tracked is counted (later in the stream), and zeroes the guard's counters.
__global__ void __launch_bounds__(128) moments_cov_kernel(MShape s, double* __restrict__ ws, Finalize f) {
    const int K = s.C * K3 * K3, u = blockIdx.x;
    const double M = static_cast<double>(s.N) * (s.H - K3 + 1) * (s.W - K3 + 1);
    const double mu = patch_mean(ws, u, M);
    const int i = u / 9, a1 = u % 9 / 3, a2 = u % 3;
    for (int v = threadIdx.x; v < K; v += blockDim.x) {
        const int j = v / 9, b1 = v % 9 / 3, b2 = v % 3;
        const int d1 = b1 - a1, d2 = b2 - a2;
        const double sxy = d1 >= 0 ? window_sum(ws, combo(i, j, d1, d2 + 2), a1, a2)
                                   : window_sum(ws, combo(j, i, -d1, -d2 + 2), b1, b2);  // Σ is symmetric
        ws[COV_OFFSET + u * K + v] = sxy / M - mu * patch_mean(ws, v, M);
    }
    if (threadIdx.x == 0) {
        ws[MEAN_OFFSET + u] = mu;
        if (u == 0) {
            ws[FACTOR_OFFSET] = kb::bn_running_weight(f.momentum, f.num_batches_tracked);
            if (f.guard) {
                f.guard[0] = 0u;
                f.guard[1] = 0u;
                for (int k = 0; k < RISK_SLOTS; ++k) ws[RISK_OFFSET + k] = 0.0;
            }
        }
    }
}

// The guard's part of fold block c (one thread): channel c's terms of the predicted errors E and E_conv (the
// header's formulas; ρ_c² = frob / var², written without dividing by var, which is 0 for a constant channel; q =
// Q_c), added in double; the last block to arrive compares them with the allowance and sets the flag (NaN: in
// place). E, the allowance and E_conv stay in the workspace for inspection.
__device__ __forceinline__ void guard_channel(const Finalize& f, int K, int c, double var, double frob, double q) {
    const double g = (f.gamma ? f.gamma[c] : 1.0) * f.scale, gg = g * g;
    const double be = (f.beta ? f.beta[c] : 0.0) * f.scale;
    const double ve = var + f.eps, r = ve > 0.0 ? var / ve : 0.0, fl = f.model.floor, sp = f.model.spread;
    const double num = ve > 0.0 ? gg * (fl * fl * r * r * r + sp * sp * frob * var / (ve * ve * ve)) : 0.0;
    atomicAdd(f.risk + RISK_NUM, num);
    atomicAdd(f.risk + RISK_DEN, gg * r + be * be);
    if (f.tc_conv) atomicAdd(f.risk + RISK_CONV, ve > 0.0 ? gg * q / ve : 0.0);
    __threadfence();  // the terms before the arrival
    if (atomicAdd(reinterpret_cast<unsigned*>(f.risk + RISK_ARRIVALS), 1u) != gridDim.x - 1) return;
    __threadfence();
    const double n = atomicAdd(f.risk + RISK_NUM, 0.0), d = atomicAdd(f.risk + RISK_DEN, 0.0);
    const double nc = atomicAdd(f.risk + RISK_CONV, 0.0);
    const double e = d > 0.0 ? 0.5 * U32 * sqrt(n / d) : 0.0, allowed = guard_allowance(K);
    const double ec = d > 0.0 && f.tc_conv ? CONV_TF32_UNIT * U32 * sqrt(nc / d) : 0.0;
    f.risk[RISK_PREDICTED] = e;
    f.risk[RISK_ALLOWED] = allowed;
    f.risk[RISK_PREDICTED_CONV] = ec;
    *f.guard = !(e <= allowed)                     ? FLAG_INPLACE
               : sqrt(e * e + ec * ec) <= allowed ? FLAG_MOMENTS
                                                  : FLAG_MOMENTS_FFMA_CONV;
}

// Block c: mean_c = w_c·(m + pivot) + bias_c and var_c = w_cᵀΣw_c in double; the running statistics; the folded
// weights and bias.
constexpr int F_THREADS = 128;

__global__ void __launch_bounds__(F_THREADS) moments_fold_kernel(const float* __restrict__ x, MShape s,
                                                                 const double* __restrict__ ws, Finalize f) {
    __shared__ double cov[KMAX * KMAX];  // 41,472 B: staged with independent loads, not read in a dependent chain
    __shared__ double wc[KMAX];
    __shared__ double mp[KMAX];  // the patch mean of x − p
    __shared__ double red[4][F_THREADS / 32];
    const int K = s.C * K3 * K3, c = blockIdx.x;
    const double M = static_cast<double>(s.N) * (s.H - K3 + 1) * (s.W - K3 + 1);
    for (int v = threadIdx.x; v < K; v += F_THREADS) {
        wc[v] = f.w[static_cast<int64_t>(c) * K + v];
        mp[v] = ws[MEAN_OFFSET + v];
    }
    for (int e = threadIdx.x; e < K * K; e += F_THREADS) cov[e] = ws[COV_OFFSET + e];
    __syncthreads();
    // excerpt: guard
    double var = 0.0, mu = 0.0, frob = 0.0;  // w_cᵀΣw_c, the mean, ‖(w_c w_cᵀ) ∘ S‖_F² with S = Σ + m·mᵀ
    double q = 0.0;                          // Q_c = Σ_v w_v²·E[x_v²]: the products' size, x as convolved
    for (int v = threadIdx.x; v < K; v += F_THREADS) {  // thread v: w_v · Σ_u w_u Σ[u, v]
        double part = 0.0, fpart = 0.0;
        for (int u = 0; u < K; ++u) {
            part = fma(wc[u], cov[u * K + v], part);
            const double ws_uv = wc[u] * fma(mp[u], mp[v], cov[u * K + v]);  // w_u·S[u, v]
            fpart = fma(ws_uv, ws_uv, fpart);
        }
        var = fma(wc[v], part, var);
        frob = fma(wc[v] * wc[v], fpart, frob);
        const double ex = mp[v] + pivot(x, s, v / 9);  // E[x] = E[x − pivot] + pivot
        mu = fma(wc[v], ex, mu);
        q = fma(wc[v] * wc[v], fma(ex, ex, cov[v * K + v]), q);  // E[x²] = Σ[v, v] + E[x]²
    }
    for (int o = 16; o > 0; o >>= 1) {
        var += __shfl_xor_sync(0xffffffffu, var, o);
        mu += __shfl_xor_sync(0xffffffffu, mu, o);
        frob += __shfl_xor_sync(0xffffffffu, frob, o);
        q += __shfl_xor_sync(0xffffffffu, q, o);
    }
    if (threadIdx.x % 32 == 0) {
        red[0][threadIdx.x / 32] = var;
        red[1][threadIdx.x / 32] = mu;
        red[2][threadIdx.x / 32] = frob;
        red[3][threadIdx.x / 32] = q;
    }
    __syncthreads();
    var = 0.0; mu = 0.0; frob = 0.0; q = 0.0;
#pragma unroll
    for (int k = 0; k < F_THREADS / 32; ++k) { var += red[0][k]; mu += red[1][k]; frob += red[2][k]; q += red[3][k]; }
    var = var > 0.0 ? var : 0.0;  // rounding can leave a tiny negative for a constant output
    if (f.guard && threadIdx.x == 0) guard_channel(f, K, c, var, frob, q);
    // end excerpt: guard
    const double bias = f.bias ? f.bias[c] : 0.0;
    mu += bias;
    const kb::BnMap map = kb::bn_map(mu, var, f.eps, f.gamma, f.beta, c, f.scale);  // bn_stats.cuh
    const double a = map.a;
    for (int v = threadIdx.x; v < K; v += F_THREADS)
        f.w_fold[static_cast<int64_t>(c) * K + v] = static_cast<float>(wc[v] * a);
    if (threadIdx.x == 0) {
        f.b_fold[c] = static_cast<float>((bias - mu) * a + map.b);
        if (f.running_mean) {
            const double m = ws[FACTOR_OFFSET];
            const double var_unbiased = var * M / (M - 1.0);
            const float rm = kb::bn_running(m, f.running_mean[c], mu);
            const float rv = kb::bn_running(m, f.running_var[c], var_unbiased);
            if (f.staged) {  // "auto": committed by moments_commit_kernel only if the guard stays 0
                f.staged[c] = rm;
                f.staged[f.C_out + c] = rv;
            } else {
                f.running_mean[c] = rm;
                f.running_var[c] = rv;
                if (c == 0 && f.num_batches_tracked) *f.num_batches_tracked += 1;  // the weight was read before
            }
        }
    }
}

// "auto", after the fold: when the guard chose the moments (flag 0 or 2), the staged running statistics become the
// running statistics and the batch is counted; otherwise the in-place path updates them. One block.
constexpr int C_THREADS = 256;

__global__ void __launch_bounds__(C_THREADS) moments_commit_kernel(Finalize f) {
    if (*f.guard == FLAG_INPLACE) return;
    for (int c = threadIdx.x; c < f.C_out; c += C_THREADS) {
        f.running_mean[c] = f.staged[c];
        f.running_var[c] = f.staged[f.C_out + c];
    }
    if (threadIdx.x == 0 && f.num_batches_tracked) *f.num_batches_tracked += 1;
}

}  // namespace cbm
