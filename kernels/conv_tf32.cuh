// conv_tf32.cuh — P73's 3×3 convolution as an implicit GEMM on the tensor cores, float32-accurate through
// the 3xTF32 split (tf32.cuh): y = conv(x, w) + b, NCHW float32, stride 1, no padding, C_in ≤ 8.
// Included by conv_bn_scale.cu, whose eval mode and training strategies can write their output with it.
//
// The GEMM: rows = output channels (M), columns = output pixels of one row (N), depth = C_in·9 (K = 72 for
// P73), ordered (kh, kw, ci): each 8-deep k-step is one filter tap (kh, kw) over the 8 input channels
// (fewer channels are padded with zeros). So the B fragment of a step is a window of the staged input,
// shifted by the tap: lane (g, t) reads channel t (and t + 4), column g + kw — no im2col, in memory or in
// shared memory.
//
// A block computes 2 output rows × 128 columns × 64 channels of one image (the FFMA kernel's tile), with 8
// warps: warp (r, q) owns row r and columns 32q … 32q + 31, for all 64 channels — 4 × 4 mma tiles of 16
// channels × 8 pixels, whose accumulators stay in registers. Persistent blocks walk the tiles; the next
// tile's input rows are copied (cp.async) while this one is computed. The filter is split once per block
// into TF32 (hi, lo) planes, stored in the order of the A fragments (one 16-byte load per fragment); each
// input value is split (split_fast) as its B fragment is loaded.
// Each step's three products (small terms first) start from zero and join the accumulator in a rounded
// FADD, as in gemm_3xtf32.cu's versions 2–5: chained through all 27 products inside the mma instead, P73's
// error against float64 was ten times larger (8.5e-7 against 8.4e-8 on an H200) and no faster.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "tf32.cuh"

namespace cbt {

constexpr int K3 = 3;
constexpr int CI = 8;                      // input channels per k-step (the mma's depth)
constexpr int MT = 4, NT = 4;              // mma tiles per warp: 4 × 16 channels, 4 × 8 pixels
constexpr int CO_B = 16 * MT;              // 64 output channels per tile
constexpr int ROWS = 2;                    // output rows per tile
constexpr int QW = 8 * NT;                 // 32 columns per warp
constexpr int TILE_W = 4 * QW;             // 128 columns per tile
constexpr int THREADS = 32 * ROWS * 4;     // 8 warps
constexpr int IN_ROWS = ROWS + K3 - 1;     // 4 input rows feed 2 output rows
constexpr int IN_W = TILE_W + K3 - 1;      // 130 input columns feed 128 output columns
constexpr int PITCH = TILE_W + 4;          // 132: rows start 16-byte aligned (for 16-byte copies)
// Lane (g, t) of a B load reads channel t, column g: with a channel stride of 8 (mod 32) floats the 32
// lanes hit 32 different banks (4·552 ≡ 0, and t·8 + g covers 0 … 31).
constexpr int CSTRIDE = IN_ROWS * PITCH + 24;  // 552
constexpr int IN_BUF = CI * CSTRIDE;           // floats per input buffer
constexpr int W_PLANE = K3 * K3 * MT * 32 * 4; // 4,608 TF32 words per plane: [tap][mtile][lane][4]
constexpr int SMEM_BYTES = (2 * IN_BUF + 2 * W_PLANE + CO_B) * 4;  // two input buffers, hi and lo planes, bias
static_assert(CSTRIDE % 32 == 8 && PITCH % 4 == 0, "conflict-free B loads, aligned 16-byte copies");

struct Shape {
    int N, C_in, H, W, C_out, HO, WO;
    int row_tiles, col_tiles, n_tiles;
    bool x_vec4;  // x 16-byte aligned and W % 4 == 0: rows are staged in 16-byte copies
    bool y_even;  // y 8-byte aligned and WO even: pairs of outputs are stored as float2
};

struct Tile {
    int64_t n;
    int cb, oh0, ow0;
};

__device__ __forceinline__ Tile tile_coords(int tile, const Shape& s) {
    Tile c;
    c.ow0 = (tile % s.col_tiles) * TILE_W;
    tile /= s.col_tiles;
    c.oh0 = (tile % s.row_tiles) * ROWS;
    tile /= s.row_tiles;
    c.n = tile % s.N;
    c.cb = tile / s.N;
    return c;
}

// cp.async of 4 or 16 bytes; src-size 0 writes zeros without reading (src must still be a valid address).
template <int BYTES>
__device__ __forceinline__ void copy(float* dst, const float* src, bool ok) {
#if __CUDA_ARCH__ >= 800
    const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    if (BYTES == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(ok ? 16 : 0));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(ok ? 4 : 0));
#endif
}

__device__ __forceinline__ void commit() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}

template <int pending>
__device__ __forceinline__ void wait() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(pending));
#endif
}

// Input rows oh0 … oh0+3, columns ow0 … ow0+129 (131 with 16-byte copies) of all 8 channels into `in`;
// zeros for channels ≥ C_in and outside the image (they feed only outputs that are never stored).
__device__ __forceinline__ void stage_input(float* in, const float* __restrict__ x, const Shape& s, const Tile& t) {
    const int64_t plane = static_cast<int64_t>(s.H) * s.W;
    if (s.x_vec4) {  // thread (row, part): 8 threads per staged row, 33 chunks of 4 floats per row
        static_assert(THREADS == CI * IN_ROWS * 8 && PITCH == 4 * 33, "one staged row per 8 threads");
        const int c = threadIdx.x / (8 * IN_ROWS), row = (threadIdx.x / 8) % IN_ROWS, part = threadIdx.x % 8;
        const int ih = t.oh0 + row;
        const bool row_ok = c < s.C_in && ih < s.H;
        const float* src = row_ok ? x + (t.n * s.C_in + c) * plane + static_cast<int64_t>(ih) * s.W + t.ow0 : x;
        float* dst = in + c * CSTRIDE + row * PITCH;
#pragma unroll
        for (int u = 0; u < 5; ++u) {
            const int col = 4 * (part + 8 * u);  // W % 4 == 0: a chunk is all in or all out
            if (u == 4 && part != 0) break;        // the 33rd chunk: columns 128 … 131
            const bool ok = row_ok && t.ow0 + col < s.W;
            copy<16>(dst + col, ok ? src + col : x, ok);
        }
    } else {
        for (int i = threadIdx.x; i < CI * IN_ROWS * IN_W; i += THREADS) {
            const int c = i / (IN_ROWS * IN_W), row = (i / IN_W) % IN_ROWS, col = i % IN_W;
            const int ih = t.oh0 + row, iw = t.ow0 + col;
            const bool ok = c < s.C_in && ih < s.H && iw < s.W;
            copy<4>(in + c * CSTRIDE + row * PITCH + col,
                    ok ? x + (t.n * s.C_in + c) * plane + static_cast<int64_t>(ih) * s.W + iw : x, ok);
        }
    }
}

// The filter of channels co0 … co0+63 as TF32 (hi, lo) planes in A-fragment order: word e of lane (g, t)'s
// fragment for tap k and mma tile i is W[co0 + 16i + g + 8·(e & 1)][t + 4·(e >> 1)][k] (zero when missing);
// and their bias (zero when missing or null).
__device__ __forceinline__ void stage_weights(uint32_t* w_hi, uint32_t* w_lo, float* b_s, const float* __restrict__ w,
                                              const float* __restrict__ b, const Shape& s, int co0) {
    if (threadIdx.x < CO_B) b_s[threadIdx.x] = b != nullptr && co0 + threadIdx.x < s.C_out ? b[co0 + threadIdx.x] : 0.f;
    for (int i = threadIdx.x; i < W_PLANE; i += THREADS) {
        const int e = i & 3, lane = (i >> 2) & 31, mt = (i >> 7) % MT, k = i / (128 * MT);
        const int co = co0 + 16 * mt + (lane >> 2) + 8 * (e & 1), ci = (lane & 3) + 4 * (e >> 1);
        const float v = co < s.C_out && ci < s.C_in ? w[(static_cast<int64_t>(co) * s.C_in + ci) * K3 * K3 + k] : 0.f;
        kb::split(v, w_hi[i], w_lo[i]);
    }
}

// excerpt: taps
// acc[i][j] += Σ over the 9 taps of W(tap)[16 channels of tile i] · X(tap)[8 channels × 8 pixels of tile j].
// in: the staged input at this warp's row and first column; valid_mt: mma tiles with a channel < C_out.
__device__ __forceinline__ void compute(float (&acc)[MT][NT][4], const float* in, const uint32_t* w_hi,
                                        const uint32_t* w_lo, int valid_mt, int lane) {
    const int g = lane >> 2, t = lane & 3;
    const float* xb = in + t * CSTRIDE + g;  // B fragment: channels t and t + 4, column g
#pragma unroll
    for (int k = 0; k < K3 * K3; ++k) {
        uint32_t b_hi[NT][2], b_lo[NT][2];
#pragma unroll
        for (int j = 0; j < NT; ++j) {  // the tap shifts the window: row kh, column kw
            const float* p = xb + (k / K3) * PITCH + k % K3 + 8 * j;
            kb::split_fast(p[0], b_hi[j][0], b_lo[j][0]);
            kb::split_fast(p[4 * CSTRIDE], b_hi[j][1], b_lo[j][1]);
        }
#pragma unroll
        for (int i = 0; i < MT; ++i) {
            if (i >= valid_mt) break;  // warp-uniform: channels past C_out
            const int f = ((k * MT + i) * 32 + lane) * 4;
            const uint4 h = *reinterpret_cast<const uint4*>(w_hi + f);
            const uint4 l = *reinterpret_cast<const uint4*>(w_lo + f);
            const uint32_t a_hi[4] = {h.x, h.y, h.z, h.w}, a_lo[4] = {l.x, l.y, l.z, l.w};
            float step[NT][4];
#pragma unroll
            for (int j = 0; j < NT; ++j) kb::mma0(step[j], a_lo, b_hi[j]);  // small terms first, from zero
#pragma unroll
            for (int j = 0; j < NT; ++j) kb::mma(step[j], a_hi, b_lo[j]);
#pragma unroll
            for (int j = 0; j < NT; ++j) kb::mma(step[j], a_hi, b_hi[j]);
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[i][j][e] += step[j][e];  // the step joins, rounded
        }
    }
}
// end excerpt: taps

// guard: null, or run only when *guard == run_if ("auto" training: 0 for the moments path, 1 for in place).
__global__ void __launch_bounds__(THREADS, 2)  // 2 blocks per SM: at most 128 registers
conv3x3_3xtf32_kernel(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
                      float* __restrict__ y, Shape s, const unsigned* guard, unsigned run_if) {
    if (guard != nullptr && *guard != run_if) return;  // block-uniform, before any barrier or store
    extern __shared__ __align__(16) float smem[];
    uint32_t* w_hi = reinterpret_cast<uint32_t*>(smem + 2 * IN_BUF);
    uint32_t* w_lo = w_hi + W_PLANE;
    float* b_s = reinterpret_cast<float*>(w_lo + W_PLANE);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int r = warp >> 2, q = warp & 3;  // output row r of the tile, columns 32q …
    const int g = lane >> 2, t = lane & 3;
    int resident_cb = -1, buf = 0;

    if (blockIdx.x < s.n_tiles) stage_input(smem, x, s, tile_coords(blockIdx.x, s));
    commit();
    for (int tile = blockIdx.x; tile < s.n_tiles; tile += gridDim.x) {
        const Tile tc = tile_coords(tile, s);
        const int co0 = tc.cb * CO_B;
        const int next = tile + gridDim.x;
        if (next < s.n_tiles) stage_input(smem + (buf ^ 1) * IN_BUF, x, s, tile_coords(next, s));
        commit();
        if (resident_cb != tc.cb) {  // tiles run channel block slowest: once per block for C_out ≤ 64
            stage_weights(w_hi, w_lo, b_s, w, b, s, co0);
            resident_cb = tc.cb;
        }
        const int valid_mt = min(MT, (s.C_out - co0 + 15) / 16);

        wait<1>();  // this tile's rows have landed (the next tile's may still be in flight)
        __syncthreads();
        float acc[MT][NT][4];
#pragma unroll
        for (int i = 0; i < MT; ++i) {
            const float b0 = b_s[16 * i + g], b1 = b_s[16 * i + g + 8];
#pragma unroll
            for (int j = 0; j < NT; ++j) acc[i][j][0] = acc[i][j][1] = b0, acc[i][j][2] = acc[i][j][3] = b1;
        }
        compute(acc, smem + buf * IN_BUF + r * PITCH + q * QW, w_hi, w_lo, valid_mt, lane);
        __syncthreads();  // before the next iteration stages into this buffer or restages the filter
        buf ^= 1;

        // Epilogue: lane (g, t) holds channels 16i + g (+8), columns 8j + 2t (+1): a float2 per channel
        // where rows start 8-byte aligned (P73), single floats otherwise and at the edges.
        const int oh = tc.oh0 + r;
        if (oh >= s.HO) continue;
        const int64_t plane = static_cast<int64_t>(s.HO) * s.WO;
        const bool pairs_ok = s.y_even && (s.WO & 1) == 0;
        float* yrow = y + (tc.n * s.C_out * plane) + static_cast<int64_t>(oh) * s.WO;
        const int col0 = tc.ow0 + q * QW + 2 * t;
        if (pairs_ok && co0 + CO_B <= s.C_out && tc.ow0 + (q + 1) * QW <= s.WO) {  // all 32 columns, 64 channels
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    float* yc = yrow + (co0 + 16 * i + g + 8 * h) * plane + col0;
#pragma unroll
                    for (int j = 0; j < NT; ++j)
                        *reinterpret_cast<float2*>(yc + 8 * j) = make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
                }
            continue;
        }
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int co = co0 + 16 * i + g + 8 * h;
                if (co >= s.C_out) continue;
                float* yc = yrow + co * plane;
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                    const int col = col0 + 8 * j;
                    const float v0 = acc[i][j][2 * h], v1 = acc[i][j][2 * h + 1];
                    if (pairs_ok && col + 1 < s.WO) {
                        *reinterpret_cast<float2*>(yc + col) = make_float2(v0, v1);
                    } else {
                        if (col < s.WO) yc[col] = v0;
                        if (col + 1 < s.WO) yc[col + 1] = v1;
                    }
                }
            }
    }
}

// Tiles of the output (0 for an empty one).
inline int64_t tiles(int64_t N, int H, int W, int C_out) {
    const int64_t ho = H - K3 + 1, wo = W - K3 + 1;
    if (N <= 0 || C_out <= 0 || ho <= 0 || wo <= 0) return 0;
    return N * ((ho + ROWS - 1) / ROWS) * ((wo + TILE_W - 1) / TILE_W) * ((C_out + CO_B - 1) / CO_B);
}

// Persistent grid: the blocks that fit on the GPU at once (asked once per device, after the shared-memory
// opt-in). A plain static function: its cache is this module's own (see conv_bn_scale.cu's resident_blocks).
static cudaError_t resident_blocks(int* out) {
    static int cache[64] = {};
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) return err;
    int& blocks = cache[device % 64];
    if (blocks == 0) {
        int sms = 0, per_sm = 0;
        err = cudaFuncSetAttribute(conv3x3_3xtf32_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES);
        if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
        if (err == cudaSuccess)
            err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, conv3x3_3xtf32_kernel, THREADS, SMEM_BYTES);
        if (err != cudaSuccess) return err;
        blocks = sms * (per_sm > 0 ? per_sm : 1);
    }
    *out = blocks;
    return cudaSuccess;
}

// y = conv(x, w) + b on the tensor cores; C_in ≤ 8 (the caller checks), the GPU sm_80 or newer.
static cudaError_t conv(const float* x, const float* w, const float* b, float* y, int64_t N, int C_in, int H, int W,
                        int C_out, const unsigned* guard, unsigned run_if, cudaStream_t stream) {
    const int64_t n_tiles = tiles(N, H, W, C_out);
    if (n_tiles == 0) return cudaSuccess;
    if (n_tiles > INT32_MAX || C_in < 1 || C_in > CI) return cudaErrorInvalidValue;
    Shape s{static_cast<int>(N), C_in, H, W, C_out, H - K3 + 1, W - K3 + 1, 0, 0, static_cast<int>(n_tiles),
            W % 4 == 0 && (reinterpret_cast<uintptr_t>(x) & 15) == 0, (reinterpret_cast<uintptr_t>(y) & 7) == 0};
    s.row_tiles = (s.HO + ROWS - 1) / ROWS;
    s.col_tiles = (s.WO + TILE_W - 1) / TILE_W;
    int blocks = 0;
    const cudaError_t err = resident_blocks(&blocks);
    if (err != cudaSuccess) return err;
    const int grid = s.n_tiles < blocks ? s.n_tiles : blocks;
    conv3x3_3xtf32_kernel<<<grid, THREADS, SMEM_BYTES, stream>>>(x, w, b, y, s, guard, run_if);
    return cudaGetLastError();
}

}  // namespace cbt
