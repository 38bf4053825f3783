// bn_stats.cuh — training-mode BatchNorm statistics, shared by chapter 1 (bn_train.cu), chapter 7's in-place
// path (conv_bn_scale.cu) and the moments' fold (conv_moments.cuh): one definition of each step.
//
//   pivot      a value near each channel's mean, the same in every block of the channel: the mean of 32 of its
//              values spread over the whole batch. Statistics summed about it do not lose digits to a mean
//              that dwarfs the spread (Welford's mean errs by about u·|mean − pivot| instead of u·|mean|).
//   finalize   batch mean and biased variance → the per-channel map y = (x − m)·a + b of BN followed by ·s:
//                  m = mean,  a = γ·(1/√(var + ε))·s,  b = β·s          (in double; γ = 1, β = 0 when absent)
//              m is kept as two floats, m_hi + m_lo: one float would round it by u·|m|, which is u·|m|/σ of
//              the output's spread — a loss that grows with the mean over the spread.
//   running    nn.BatchNorm2d's update of the running statistics, with momentum m or, for momentum None,
//              the cumulative average m = 1/(num_batches_tracked + 1):
//                  running ← (1 − m)·running + m·batch   (the mean; the *unbiased* variance)
//   apply      the map per element: two subtractions and an FMA, fmaf((x − m_hi) − m_lo, a, b) (x − m_hi is
//              exact near the mean, so the error stays relative to y, not to x, even when the mean dwarfs the
//              spread), and the grid of the apply kernels: one block per (plane, tile of kBnThreads·kBnUnroll
//              work items).
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>

#include "welford.cuh"

namespace kb {

// ---- pivot ----------------------------------------------------------------------------------------------

constexpr int kBnPivotSamples = 32;  // one per lane of a warp

// The pivot of channel c of an (N, C, HW) tensor, computed by one warp (every lane gets it): the mean of
// min(32, N·HW) values at evenly spaced positions of the channel, summed in a fixed order, so that every block
// of the channel gets the same float.
__device__ __forceinline__ float bn_pivot(const float* __restrict__ x, int64_t N, int64_t C, int64_t HW,
                                          int64_t c) {
    const int lane = threadIdx.x & 31;
    const int64_t values = N * HW;
    const int64_t k = values < kBnPivotSamples ? values : kBnPivotSamples;
    float v = 0.f;
    if (lane < k) {
        const int64_t t = lane * values / k;  // position in the channel: sample t / HW, element t % HW
        v = __ldg(x + (t / HW * C + c) * HW + t % HW);
    }
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    return __shfl_sync(0xffffffffu, v, 0) / static_cast<float>(k);
}

// ---- finalize -------------------------------------------------------------------------------------------

// y = (x − m)·a + b for one channel.
struct BnMap {
    double m, a, b;
};

// The map of channel c from its batch mean and biased variance (gamma, beta: null for γ = 1, β = 0).
__host__ __device__ __forceinline__ BnMap bn_map(double mean, double var, float eps, const float* gamma,
                                                 const float* beta, int64_t c, float scale) {
    const double invstd = 1.0 / sqrt(var + static_cast<double>(eps));
    const double g = gamma ? static_cast<double>(gamma[c]) : 1.0;
    const double be = beta ? static_cast<double>(beta[c]) : 0.0;
    return BnMap{mean, g * invstd * scale, be * scale};
}

// ---- running statistics ---------------------------------------------------------------------------------

// The weight of this batch: momentum, or (momentum < 0: None) the cumulative average 1/(batches + 1), read
// before the batch is counted. Without a counter, momentum is returned as is.
__host__ __device__ __forceinline__ double bn_running_weight(float momentum, const int64_t* num_batches_tracked) {
    if (momentum >= 0.f || num_batches_tracked == nullptr) return static_cast<double>(momentum);
    return 1.0 / static_cast<double>(*num_batches_tracked + 1);
}

// One running statistic updated with weight m: (1 − m)·running + m·batch.
__host__ __device__ __forceinline__ float bn_running(double m, float running, double batch) {
    return static_cast<float>((1.0 - m) * running + m * batch);
}

// Training-mode finalize of channel c from its merged Welford state (in double): the map into mab ([4·C]: all
// m_hi, all m_lo, all a, all b) and, when running_mean is given, the running statistics updated in place.
// Returns the biased batch variance.
__device__ __forceinline__ double bn_finish_channel(const Welford<double>& tot, int64_t c, int64_t C, float* mab,
                                                    const float* gamma, const float* beta, float* running_mean,
                                                    float* running_var, const int64_t* num_batches_tracked,
                                                    float momentum, float eps, float scale) {
    const double var = tot.m2 / tot.n;  // biased: normalises this batch
    const BnMap map = bn_map(tot.mean, var, eps, gamma, beta, c, scale);
    const float m_hi = static_cast<float>(map.m);
    mab[c] = m_hi;
    mab[C + c] = static_cast<float>(map.m - static_cast<double>(m_hi));  // m_lo: what m_hi rounded off
    mab[2 * C + c] = static_cast<float>(map.a);
    mab[3 * C + c] = static_cast<float>(map.b);
    if (running_mean) {
        const double m = bn_running_weight(momentum, num_batches_tracked);
        const double var_unbiased = tot.m2 / (tot.n - 1.0);  // updates the running estimate
        running_mean[c] = bn_running(m, running_mean[c], tot.mean);
        running_var[c] = bn_running(m, running_var[c], var_unbiased);
    }
    return var;
}

// ---- apply ----------------------------------------------------------------------------------------------

constexpr int kBnThreads = 256;  // threads per block of the apply kernels (8 warps)
constexpr int kBnUnroll = 4;     // vector loads in flight per thread

template <int V> struct Vec;
template <> struct Vec<4> { using T = float4; };
template <> struct Vec<1> { using T = float; };

// The map's four floats for one channel, read from mab [4·C].
struct BnApply {
    float m_hi, m_lo, a, b;
};
__device__ __forceinline__ BnApply bn_apply_of(const float* mab, int64_t C, int64_t c) {
    return BnApply{mab[c], mab[C + c], mab[2 * C + c], mab[3 * C + c]};
}

__device__ __forceinline__ float normalise(float v, const BnApply& m) { return fmaf((v - m.m_hi) - m.m_lo, m.a, m.b); }
__device__ __forceinline__ float4 normalise(float4 v, const BnApply& m) {
    return make_float4(normalise(v.x, m), normalise(v.y, m), normalise(v.z, m), normalise(v.w, m));
}

inline bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

// The float4 path when every plane of HW floats starts on a 16-byte boundary.
inline bool bn_vec4(const float* x, const float* y, int64_t HW) { return HW % 4 == 0 && aligned16(x) && aligned16(y); }

// The apply grid over N·C planes of HW floats (V per work item): planes in x (up to 2^31 − 1), tiles of
// kBnThreads·kBnUnroll items in y (up to 65535). False when the shape does not fit.
inline bool bn_apply_grid(int64_t N, int64_t C, int64_t HW, int V, dim3* grid) {
    const int64_t tiles = (HW / V + kBnThreads * kBnUnroll - 1) / (kBnThreads * kBnUnroll);
    const int64_t planes = N * C;
    if (planes > INT_MAX || tiles > 65535) return false;
    *grid = dim3(static_cast<unsigned>(planes), static_cast<unsigned>(tiles));
    return true;
}

// The largest plane (H·W floats) the apply grid covers: 65535 tiles of kBnThreads·kBnUnroll floats.
constexpr int64_t bn_apply_max_plane() { return int64_t{65535} * kBnThreads * kBnUnroll; }

}  // namespace kb
