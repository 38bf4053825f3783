// conv2d_folded.cu — a direct 2-D convolution with bias, y = conv(x, W) + b: stride 1, no padding,
// NCHW float32 in and out, plain FFMA (no TF32). With W and b folded from an eval-mode BatchNorm and
// a scale factor (kernelbook/folding.py), this one launch is the whole of P73 in eval mode.
//
// Two versions, the chapter compares them:
//   conv2d_simple_kernel — one thread per output element, every operand loaded from global memory.
//   conv2d_tiled_kernel  — register blocking: each thread owns 8 output channels × 4 columns (32
//                          accumulators), so each input value it loads feeds up to 2·8 FMAs (12 on
//                          average) and each weight feeds 4; the block stages its input rows and its weights in shared memory.
#include "conv2d_folded.h"

#include <cuda_runtime.h>

#include <atomic>
#include <climits>
#include <cstdint>

namespace {

// ---------------------------------------------------------------------------------------------------
// Version 1: one thread per output element (n, co, oh, ow), ow fastest, so a warp's 32 stores are
// consecutive floats. Works for any square kernel size K.
// ---------------------------------------------------------------------------------------------------
__global__ void conv2d_simple_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                     const float* __restrict__ b, float* __restrict__ y, int C_in, int H, int W,
                                     int C_out, int K, int64_t total) {
    const int HO = H - K + 1, WO = W - K + 1;
// excerpt: simple
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
        const int ow = static_cast<int>(i % WO);
        int64_t t = i / WO;
        const int oh = static_cast<int>(t % HO);
        t /= HO;
        const int co = static_cast<int>(t % C_out);
        const int64_t n = t / C_out;
        float acc = 0.0f;
        for (int ci = 0; ci < C_in; ++ci) {
            const float* xp = x + ((n * C_in + ci) * H + oh) * W + ow;
            const float* wp = w + (static_cast<int64_t>(co) * C_in + ci) * K * K;
            for (int kh = 0; kh < K; ++kh)
                for (int kw = 0; kw < K; ++kw) acc = fmaf(xp[kh * W + kw], wp[kh * K + kw], acc);
        }
        y[i] = acc + b[co];
    }
// end excerpt: simple
}

// ---------------------------------------------------------------------------------------------------
// Version 2: register-blocked and tiled, for 3×3 kernels.
//
// A block computes a tile of ROWS output rows × TILE_W output columns × (CO_T · groups) output
// channels of one image. Warp (g, r) owns row r and channels CO_T·g … CO_T·g + CO_T−1; lane l owns
// the column pairs 2l + 64p (p = 0, 1), so each warp store writes 32 consecutive float2 = 256
// contiguous bytes. Per input channel and filter row, a thread reads 8 input values and 3·CO_T
// weights from shared memory (weights as float4 broadcasts: every lane reads the same address) and
// issues 12·CO_T FFMAs.
// Blocks are persistent: each loops over tiles, keeping its weights in shared memory when all input
// channels fit one chunk (P73: 8 input channels), so weights are staged once per block, not per tile.
// ---------------------------------------------------------------------------------------------------
// The tile shape can be changed at compile time (-DKB_CONV_ROWS=4 …) to explore it; the defaults are
// the best spill-free shape measured on an H200 for P73 (chapter 2's sweep, notes/conv2d_folded.md).
#ifndef KB_CONV_ROWS
#define KB_CONV_ROWS 1
#endif
#ifndef KB_CONV_CO_T
#define KB_CONV_CO_T 8
#endif
#ifndef KB_CONV_GROUPS
#define KB_CONV_GROUPS 8
#endif
#ifndef KB_CONV_MIN_BLOCKS
#define KB_CONV_MIN_BLOCKS 3
#endif
constexpr int K3 = 3;
constexpr int PAIRS = 2;                       // column pairs per lane
constexpr int TILE_W = 2 * 32 * PAIRS;         // 128 output columns per warp (P73: 126 → one tile per row)
constexpr int ROWS = KB_CONV_ROWS;             // output rows per block, one warp each per channel group
constexpr int CO_T = KB_CONV_CO_T;             // output channels per thread (a multiple of 4: float4 weights)
static_assert(CO_T % 4 == 0, "weights are read as float4: CO_T must be a multiple of 4");
constexpr int MAX_GROUPS = KB_CONV_GROUPS;     // channel groups per block: CO_T·MAX_GROUPS channels (P73: 64)
constexpr int CO_B = CO_T * MAX_GROUPS;
constexpr int CI_CHUNK = 8;                    // input channels staged at a time (P73: all 8)
constexpr int IN_ROWS = ROWS + K3 - 1;
constexpr int IN_W = TILE_W + K3 - 1;          // 130 input columns feed 128 output columns
constexpr int IN_PITCH = TILE_W + 4;           // 132: a multiple of 4 floats keeps float2 reads aligned
constexpr int THREADS = 32 * ROWS * MAX_GROUPS;

struct TiledShape {
    int N, C_in, H, W, C_out, HO, WO;
    int row_tiles, col_tiles, co_blocks, groups;
    int n_tiles;
    bool y_even;  // y's base address is 8-byte aligned: float2 stores are legal where the offset is even
};

__global__ void __launch_bounds__(THREADS, KB_CONV_MIN_BLOCKS)
conv2d_tiled_kernel(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
                    float* __restrict__ y, TiledShape s) {
    __shared__ __align__(16) float in_s[CI_CHUNK][IN_ROWS][IN_PITCH];
    __shared__ __align__(16) float w_s[CI_CHUNK][K3 * K3][CO_B];

    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int r = warp % ROWS;
    const int g = warp / ROWS;
    const int n_threads = 32 * ROWS * s.groups;
    const int co_b = CO_T * s.groups;          // channels per block
    const bool weights_resident = s.C_in <= CI_CHUNK;
    int resident_co_block = -1;

// excerpt: tile
    // Tile order: channel block slowest, so consecutive tiles of a block share their weights. The
    // launcher guarantees n_tiles + gridDim.x < 2^31 (32-bit tile arithmetic keeps registers for the FMAs).
    for (int tile = blockIdx.x; tile < s.n_tiles; tile += gridDim.x) {
        int t = tile;
        const int ct = t % s.col_tiles;
        t /= s.col_tiles;
        const int rt = t % s.row_tiles;
        t /= s.row_tiles;
        const int64_t n = t % s.N;
        const int cb = t / s.N;
        const int oh0 = rt * ROWS, ow0 = ct * TILE_W, co0 = cb * co_b;

        // Accumulators start at the bias (one add fewer per output); channels past C_out start at 0.
        float acc[CO_T][2 * PAIRS];
#pragma unroll
        for (int c = 0; c < CO_T; ++c) {
            const int co = co0 + CO_T * g + c;
            const float bias = co < s.C_out ? b[co] : 0.0f;
#pragma unroll
            for (int j = 0; j < 2 * PAIRS; ++j) acc[c][j] = bias;
        }
// end excerpt: tile

        for (int ci0 = 0; ci0 < s.C_in; ci0 += CI_CHUNK) {
            const int nci = min(CI_CHUNK, s.C_in - ci0);
            // Stage input rows oh0 … oh0+IN_ROWS-1, columns ow0 … ow0+IN_W-1, one row per warp at a time,
            // lanes along the row (coalesced loads, no index divisions); zeros outside the image feed only
            // outputs that are never stored.
            for (int cr = warp; cr < CI_CHUNK * IN_ROWS; cr += n_threads / 32) {
                const int c = cr / IN_ROWS, row = cr % IN_ROWS, ih = oh0 + row;
                const bool row_ok = c < nci && ih < s.H;
                const float* xrow = x + ((n * s.C_in + ci0 + c) * s.H + ih) * static_cast<int64_t>(s.W) + ow0;
                for (int col = lane; col < IN_W; col += 32)
                    in_s[c][row][col] = row_ok && ow0 + col < s.W ? xrow[col] : 0.0f;
            }
            if (!weights_resident || resident_co_block != cb) {
                // w_s[c][k][co] = W[co0+co][ci0+c][k]; zeros for missing channels (their FMAs are wasted,
                // their outputs never stored).
                for (int i = threadIdx.x; i < CI_CHUNK * K3 * K3 * co_b; i += n_threads) {
                    const int co = i % co_b, k = (i / co_b) % (K3 * K3), c = i / (co_b * K3 * K3);
                    float v = 0.0f;
                    if (c < nci && co0 + co < s.C_out)
                        v = w[((static_cast<int64_t>(co0 + co) * s.C_in + ci0 + c) * K3 * K3) + k];
                    w_s[c][k][co] = v;
                }
                resident_co_block = cb;
            }
            __syncthreads();

// excerpt: inner
#pragma unroll 1
            for (int c = 0; c < nci; ++c) {
#pragma unroll
                for (int kh = 0; kh < K3; ++kh) {
                    float v[PAIRS][4];
#pragma unroll
                    for (int p = 0; p < PAIRS; ++p) {
                        const float* row = &in_s[c][r + kh][2 * lane + 64 * p];
                        const float2 a = *reinterpret_cast<const float2*>(row);
                        const float2 d = *reinterpret_cast<const float2*>(row + 2);
                        v[p][0] = a.x; v[p][1] = a.y; v[p][2] = d.x; v[p][3] = d.y;
                    }
#pragma unroll
                    for (int kw = 0; kw < K3; ++kw) {
                        const float4* wp = reinterpret_cast<const float4*>(&w_s[c][kh * K3 + kw][CO_T * g]);
#pragma unroll
                        for (int q = 0; q < CO_T / 4; ++q) {
                            const float4 w4 = wp[q];
                            const float wq[4] = {w4.x, w4.y, w4.z, w4.w};
#pragma unroll
                            for (int e = 0; e < 4; ++e)
#pragma unroll
                                for (int p = 0; p < PAIRS; ++p)
#pragma unroll
                                    for (int j = 0; j < 2; ++j)
                                        acc[4 * q + e][2 * p + j] =
                                            fmaf(v[p][j + kw], wq[e], acc[4 * q + e][2 * p + j]);
                        }
                    }
                }
            }
// end excerpt: inner
            __syncthreads();  // before the next chunk or tile overwrites the staged input
        }

        // Epilogue: float2 stores where every row starts 8-byte aligned (y aligned and WO even: P73),
        // single floats otherwise and at the right edge. A warp's float2 stores cover 256 contiguous bytes.
        const int oh = oh0 + r;
        if (oh < s.HO) {
            const int64_t plane = static_cast<int64_t>(s.HO) * s.WO;
            float* yrow = y + ((n * s.C_out + co0 + CO_T * g) * s.HO + oh) * static_cast<int64_t>(s.WO);
            const bool pairs_ok = s.y_even && (s.WO & 1) == 0;
#pragma unroll
            for (int c = 0; c < CO_T; ++c, yrow += plane) {
                if (co0 + CO_T * g + c >= s.C_out) break;
#pragma unroll
                for (int p = 0; p < PAIRS; ++p) {
                    const int col = ow0 + 2 * lane + 64 * p;
                    if (pairs_ok && col + 1 < s.WO) {
                        *reinterpret_cast<float2*>(yrow + col) = make_float2(acc[c][2 * p], acc[c][2 * p + 1]);
                    } else {
                        if (col < s.WO) yrow[col] = acc[c][2 * p];
                        if (col + 1 < s.WO) yrow[col + 1] = acc[c][2 * p + 1];
                    }
                }
            }
        }
    }
}

}  // namespace

cudaError_t launch_conv2d_simple(const float* x, const float* w, const float* b, float* y, int64_t N, int C_in,
                                 int H, int W, int C_out, int K, cudaStream_t stream) {
    const int64_t total = N * C_out * static_cast<int64_t>(H - K + 1) * (W - K + 1);
    if (total == 0) return cudaSuccess;
    const int threads = 256;
    const int64_t blocks = (total + threads - 1) / threads;
    const unsigned grid = static_cast<unsigned>(blocks < (1 << 30) ? blocks : (1 << 30));  // grid-stride beyond
    conv2d_simple_kernel<<<grid, threads, 0, stream>>>(x, w, b, y, C_in, H, W, C_out, K, total);
    return cudaGetLastError();
}

// The tiled kernel's compile-time constants by name, for the binding's config(): the chapter reads
// the tile shape from the built module instead of retyping it.
int conv2d_tiled_config(const char* const** names, const int** values) {
    static const char* const kNames[] = {"K", "CO_T", "ROWS", "GROUPS", "MIN_BLOCKS",
                                         "PAIRS", "TILE_W", "CI_CHUNK", "THREADS"};
    static const int kValues[] = {K3, CO_T, ROWS, MAX_GROUPS, KB_CONV_MIN_BLOCKS,
                                  PAIRS, TILE_W, CI_CHUNK, THREADS};
    static_assert(sizeof(kNames) / sizeof(kNames[0]) == sizeof(kValues) / sizeof(kValues[0]),
                  "one name per constant");
    *names = kNames;
    *values = kValues;
    return static_cast<int>(sizeof(kValues) / sizeof(kValues[0]));
}

// Limits the binding checks before calling (so they are reported as clear errors, not launch failures).
int conv2d_tiled_kernel_size() { return K3; }

// The tiled kernel's work list: tiles of ROWS × TILE_W × (CO_T · groups) outputs. The binding checks
// the count fits 31 bits (it always does below ~8 GB of output).
int64_t conv2d_tiled_tiles(int64_t N, int H, int W, int C_out) {
    const int64_t ho = H - K3 + 1, wo = W - K3 + 1;
    if (N <= 0 || C_out <= 0 || ho <= 0 || wo <= 0) return 0;
    const int64_t groups = (C_out + CO_T - 1) / CO_T < MAX_GROUPS ? (C_out + CO_T - 1) / CO_T : MAX_GROUPS;
    return N * ((ho + ROWS - 1) / ROWS) * ((wo + TILE_W - 1) / TILE_W) *
           ((C_out + CO_T * groups - 1) / (CO_T * groups));
}

cudaError_t launch_conv2d_tiled(const float* x, const float* w, const float* b, float* y, int64_t N, int C_in,
                                int H, int W, int C_out, cudaStream_t stream) {
    const int64_t n_tiles = conv2d_tiled_tiles(N, H, W, C_out);
    if (n_tiles == 0) return cudaSuccess;
    if (n_tiles > INT_MAX) return cudaErrorInvalidValue;
    TiledShape s;
    s.N = static_cast<int>(N); s.C_in = C_in; s.H = H; s.W = W; s.C_out = C_out;
    s.HO = H - K3 + 1; s.WO = W - K3 + 1;
    s.groups = (C_out + CO_T - 1) / CO_T < MAX_GROUPS ? (C_out + CO_T - 1) / CO_T : MAX_GROUPS;
    s.row_tiles = (s.HO + ROWS - 1) / ROWS;
    s.col_tiles = (s.WO + TILE_W - 1) / TILE_W;
    s.co_blocks = (C_out + CO_T * s.groups - 1) / (CO_T * s.groups);
    s.n_tiles = static_cast<int>(n_tiles);
    s.y_even = (reinterpret_cast<uintptr_t>(y) & 7) == 0;

    // Persistent blocks: as many as fit on the GPU at once (asked once per device and block size).
    // Atomics: two host threads may make the first call at once (the values they store are equal).
    constexpr int kCachedDevices = 64;
    static std::atomic<int> resident_cache[kCachedDevices][MAX_GROUPS + 1] = {};
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) return err;
    int resident_blocks = device < kCachedDevices ? resident_cache[device][s.groups].load() : 0;
    if (resident_blocks == 0) {
        int sms = 0, per_sm = 0;
        err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
        if (err == cudaSuccess)
            err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, conv2d_tiled_kernel, 32 * ROWS * s.groups, 0);
        if (err != cudaSuccess) return err;
        resident_blocks = sms * (per_sm > 0 ? per_sm : 1);
        if (device < kCachedDevices) resident_cache[device][s.groups].store(resident_blocks);
    }
    if (n_tiles + resident_blocks > INT_MAX) return cudaErrorInvalidValue;  // tile += gridDim.x must not overflow
    const int grid = s.n_tiles < resident_blocks ? s.n_tiles : resident_blocks;
    conv2d_tiled_kernel<<<grid, 32 * ROWS * s.groups, 0, stream>>>(x, w, b, y, s);
    return cudaGetLastError();
}
