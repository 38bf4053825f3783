// dev/cbw/conv_wgmma_x.cuh — an experiment copy of kernels/conv_wgmma.cuh (not built by the book), with variant
// switches to time on an sm_90 GPU through dev/cbw/variants.py. With every switch at its default it is the landed
// kernel's arithmetic and schedule (the staging's loads and writes as templates over the row count, the taps'
// rows by address: the same instructions), apart from the namespace (cbwx) and the switches' code.
//   CBW_TAPS (1): taps chained inside the tensor core per rounded FADD. A group of n taps issues every tap's
//     small products (lo·hi, hi·lo) first, then their hi·hi products, all into one accumulator from zero, then one
//     FADD into the running sum: 64 FADDs per thread per group instead of per tap. dev/tap_chains.py models the
//     accumulator's truncation (calibrated on two measured schedules): n = 3 errs 1.04–1.09× n = 1, n = 9 up to 2.2×.
//   CBW_STORE_FAST (0): 1 — the store part without a branch per channel pair (a pair past the last stores the
//     last one's values again, to the same address); 2 — besides, rows whose 32 channel pairs all exist, with both
//     pixels valid and y 8-byte aligned, store four float2 with no test at all. (The general part out of line, as a
//     call, spills: 120–284 bytes at the 168-register cap.)
//   CBW_STORE_LDS (0): 1 — the store part reads the shared-memory row through an index into it (LDS, 32-bit
//     addresses) rather than a generic pointer carried across tiles (LD, 64-bit addresses).
//   CBW_STATS (0): 1 — the statistics eval mode's guard needs (dev/eval_guard.py's relative rule), summed on the
//     way: Σx² and Σx⁴ per input channel by the producer (each input counted once, by channel block 0), Σy² per
//     output channel by the consumers, into stats[2·C_in + C_out] (double, zeroed by the caller) with atomics.
//     2 — the same, Σy² in two independent chains a channel (the guard's sums cost 0.041 ms in s1.p2, H100).
//   CBW_PIPE (1): 2 — the producer holds two tiles' loads: it issues tile i+1's loads before it waits for a free
//     stage and writes tile i (the landed producer waits out one tile's load latency per tile: ≈ 2.5 µs a tile
//     at 0.30 ms, the same for t3 and t9 although t9's consumers issue far fewer instructions).
//   CBW_DIAG (0), diagnostics only (wrong outputs): 1 — consumers release each stage without multiplying or
//     storing (the producer's time alone); 2 — the producer releases each stage without loading or writing it
//     (the consumers' time alone, on stale data); 3 — the consumers multiply but store nothing.
//   CBW_RS (0): 1 — the filter (wgmma's A) from registers, loaded once per block: each wgmma then reads only its
//     4 KB of B from shared memory instead of 6 KB (27 per tile: 162 KB → 108 KB). 72 more registers a consumer
//     thread, so the producer gives registers back (setmaxnreg 72) and the consumers take them (216). 2 — only
//     A_hi from registers (36), A_lo from shared memory: 162 KB → 126 KB a tile, and t3 fits (166 + 36).
//   CBW_PIX (132): pixels per staged row. 136 puts every row (and half, plane, stage) on a 128-byte boundary
//     (132 · 16 = 2,112 bytes = 16.5 lines): taps kh = 1, 2 then start their B operand line-aligned.
//   CBW_KW0 (0), a diagnostic (wrong outputs): 1 — every tap reads B at kw = 0 (no 16-byte pixel shift), so with
//     CBW_PIX 136 every wgmma's B is 128-byte aligned: what the shifted windows cost, if shared memory reads a
//     core matrix that straddles a 128-byte line as two.
//   CBW_DIAG 5: 2 and 3 at once — the products alone, no memory traffic but the operands' shared-memory reads:
//     the convolution's own tensor ceiling, in its layout and schedule (compare the book's wgmma_ceiling, 128-byte
//     swizzle, m64n256k8, one chain).
//   CBW_RING (0): 1 — a ring of RING = 3 · STAGES staged input rows instead of a stage of three rows per tile. A
//     block takes a contiguous run of its channel block's tiles, ordered down each column strip (n, column tile,
//     row), so a tile stages one new input row (three where a strip starts): the producer's global loads, splits
//     and shared-memory writes fall to a third. The tile's three rows are ring slots (q + kh) % RING, q its first
//     row's sequence number, which consumer and producer both compute from the tile's place in the run. A
//     producer at tile i has seen tiles ≤ i − STAGES released, and a tile adds at most 3 rows, so the slot it
//     overwrites is no longer read. (Not with CBW_STATS.)
//   CBW_SW32 (0): B (the staged input) K-major with the 32-byte swizzle instead of none: a pixel's 8 channels are
//     one 32-byte row (the halves' 16-byte chunks swapped in every other group of 4 pixels), 8 pixels a 256-byte
//     atom (SBO 256, LBO unused), rows of CBW_PIX = 136 pixels (17 atoms), the region 256-byte aligned. A kw shift is then a
//     32-byte step of the start address inside an atom. What the matrix base offset (bits 49–51) must be for such
//     a start is not settled by the sources read, so two forms are built and the checks decide: 1 — zero; 2 —
//     (start >> 7) & 7, the PTX ISA's rule for the 128-byte pattern. ((start >> 7) & 1 is always 0 here: every
//     start is a multiple of 256 plus kw · 32 ≤ 64, so it would build w1 again.)
// The landed kernel's description follows.
//
// The GEMM per output row: D[64 output channels × 128 pixels] = Σ over the 9 taps of W(tap)[64 × 8 input
// channels] · X(tap)[8 channels × 128 pixels], the tap's window of the staged input shifted by (kh, kw). On wgmma
// both operands come from shared memory, TF32 only K-major (K = the 8 input channels innermost):
//   * A, the filter: per tap and plane (hi, lo) [half h: channels 4h … 4h+3][64 output channels][4 floats], so a
//     core matrix (8 rows × 16 bytes) is 8 output channels × 4 inputs: LBO (the next 4 inputs) 1,024 bytes, SBO
//     (the next 8 channels) 128 bytes;
//   * B, the input: per stage and plane [h][3 input rows][PIX pixels][4 floats]: a core matrix is 8 neighbouring
//     pixels × 4 channels, LBO the plane's half (3 rows of PIX pixels), SBO 128 bytes. Tap (kh, kw) starts at row
//     kh, pixel kw: a shift of the descriptor's start address by 16 bytes per pixel — the window needs no copy
//     and no im2col.
// Each value is split once, when it is staged (hi = x rounded to TF32, lo = x − hi), so the taps spend no
// instruction on loads or splits.
//
// A tile is one output row × 128 pixels × 64 channels. A block (one per SM, persistent over the tiles of one
// 64-channel block) has three warpgroups:
//   * a producer (warpgroup 0): loads a tile's 3 input rows × 130 pixels × 8 channels from global memory (all of
//     a thread's loads in flight at once), splits them and writes the hi and lo planes into a ring of STAGES
//     stages, then arrives on the stage's `full` barrier (after a proxy fence: wgmma reads shared memory through
//     the async proxy);
//   * two consumers (warpgroups 1, 2), taking the block's tiles in turn (stages 2k + c feed consumer c). Per tap
//     three wgmma.m64n128k8 (lo·hi, hi·lo, hi·hi: the small terms first) into a fresh accumulator, then a rounded
//     FADD into the running sum (as conv_tf32.cuh does with mma.sync: chaining the taps inside the tensor core
//     erred up to 10× more). After the taps the stage is released (`empty` barrier) and the row is written into
//     shared memory; its global stores (coalesced, 256 bytes per warp store) are issued during the next tile's
//     taps, while the tensor core works, in eight parts. (Tap 0 issues none: a store there made the compiler
//     wait for that tap's products before its third wgmma.)
// Included once per variant: the switches and CBW_NS (the namespace, cbwx by default) are set before, and every
// macro this header defines or reads is undefined at its end, so one translation unit can hold several variants.
#include <cuda_runtime.h>

#include <cstdint>

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KB_CBW 1
#endif

#ifndef CBW_TAPS
#define CBW_TAPS 1
#endif
#ifndef CBW_STORE_FAST
#define CBW_STORE_FAST 0
#endif
#ifndef CBW_STORE_LDS
#define CBW_STORE_LDS 0
#endif
#ifndef CBW_STATS
#define CBW_STATS 0
#endif
#ifndef CBW_PIPE
#define CBW_PIPE 1
#endif
#ifndef CBW_KW0
#define CBW_KW0 0
#endif
#ifndef CBW_DIAG
#define CBW_DIAG 0
#endif
#ifndef CBW_RS
#define CBW_RS 0
#endif
#ifndef CBW_PIX
#define CBW_PIX 132
#endif
#ifndef CBW_RING
#define CBW_RING 0
#endif
#ifndef CBW_SW32
#define CBW_SW32 0
#endif

#ifndef CBW_RS_PRODUCER
#define CBW_RS_PRODUCER 72   // registers a producer thread keeps; 128·72 + 256·216 = 384·168, the block's
#endif
#ifndef CBW_RS_CONSUMER
#define CBW_RS_CONSUMER 216  // what a consumer thread takes (128·P + 256·C ≤ 64,512)
#endif

#ifndef CBW_NS
#define CBW_NS cbwx
#endif
namespace CBW_NS {

__device__ int g_built =
#ifdef KB_CBW
    1;
#else
    0;
#endif

constexpr int K3 = 3;
constexpr int CI = 8;               // input channels (the wgmma's depth)
constexpr int CO_B = 64;            // output channels per block (the wgmma's M)
constexpr int TILE_W = 128;         // output pixels per row (the wgmma's N)
constexpr int ROWS = 1;             // output rows per tile; the two consumer warpgroups take alternate tiles
constexpr int IN_ROWS = ROWS + K3 - 1;
constexpr int IN_W = TILE_W + K3 - 1;  // 130 staged pixels
constexpr int PIX = CBW_PIX;        // pixels per staged row (16 bytes each per half)
constexpr int STAGES = 4;           // even: stages 2k + c feed consumer c
constexpr int THREADS = 384;
constexpr int HALF_BYTES = IN_ROWS * PIX * 16;       // 6,336: one half (4 channels) of one plane
constexpr int PLANE_BYTES = 2 * HALF_BYTES;          // 12,672 (CBW_SW32: the same bytes, rows of both halves)
constexpr int STAGE_BYTES = 2 * PLANE_BYTES;         // hi and lo: 25,344
constexpr int TAP_BYTES = 2 * CO_B * 16;             // 2,048: one tap of one filter plane
constexpr int FILTER_PLANE = K3 * K3 * TAP_BYTES;    // 18,432
#if CBW_SW32
constexpr int ROW_BYTES = PIX * 32;                  // one staged row of one plane, both halves
constexpr int KW_BYTES = 32;                         // a pixel's step in B
static_assert(PIX % 8 == 0, "CBW_SW32: whole 256-byte atoms a row (CBW_PIX 136)");
#else
constexpr int ROW_BYTES = PIX * 16;                  // one staged row of one half of one plane
constexpr int KW_BYTES = 16;
#endif
#if CBW_RING && CBW_SW32
constexpr int RING = 3 * STAGES;
constexpr int B_LBO = 16;                            // unused by the swizzled K-major form
constexpr int B_PLANE = RING * ROW_BYTES;
constexpr int IN_BYTES = 2 * B_PLANE;
static_assert(!CBW_STATS, "CBW_RING counts no statistics");
#elif CBW_RING
constexpr int RING = 3 * STAGES;                     // staged input rows (see CBW_RING)
constexpr int B_LBO = RING * ROW_BYTES;              // B's next 4 channels: the ring's other half
constexpr int B_PLANE = 2 * B_LBO;                   // hi → lo
constexpr int IN_BYTES = 2 * B_PLANE;
static_assert(!CBW_STATS, "CBW_RING counts no statistics");
#else
constexpr int B_LBO = HALF_BYTES, B_PLANE = PLANE_BYTES, IN_BYTES = STAGES * STAGE_BYTES;
#endif
constexpr int FILTER_OFF = IN_BYTES;                 // 101,376
constexpr int BIAS_OFF = FILTER_OFF + 2 * FILTER_PLANE;
constexpr int OUT_PITCH = TILE_W + 8;              // 136 ≡ 8 (mod 32): a half-warp's 4 rows hit 32 banks
constexpr int OUT_OFF = BIAS_OFF + CO_B * 4;         // per consumer: the row's 64 channels × 128 pixels
constexpr int OUT_BYTES = CO_B * OUT_PITCH * 4;
constexpr int BAR_OFF = OUT_OFF + 2 * OUT_BYTES;
constexpr int SMEM_BYTES = BAR_OFF + 2 * STAGES * 8 + (CBW_SW32 ? 256 : 0);  // SW32: room to align

// Where (row, pixel px, half h) of one plane of B lies, from the plane's start (a stage's or the ring's).
__device__ __forceinline__ int b_off(int row, int px, int h) {
#if CBW_SW32
    return row * ROW_BYTES + ((px * 32 + h * 16) ^ (((px >> 2) & 1) << 4));
#else
    return h * B_LBO + row * ROW_BYTES + px * 16;
#endif
}
static_assert(HALF_BYTES % 16 == 0 && BAR_OFF % 8 == 0, "descriptor and barrier alignment");
static_assert(STAGES % 2 == 0, "each consumer owns every other stage");

struct Shape {
    int N, C_in, H, W, C_out, HO, WO;
    int row_tiles, col_tiles, tiles_per_cb;  // tiles of one 64-channel block
    bool y_even;                             // y 8-byte aligned and WO even: pairs of outputs as float2
};

__device__ __forceinline__ void tile_coords(int tile, const Shape& s, int64_t& n, int& oh0, int& ow0) {
#if CBW_RING  // down each column strip: (n, column tile, row)
    oh0 = (tile % s.row_tiles) * ROWS;
    tile /= s.row_tiles;
    ow0 = (tile % s.col_tiles) * TILE_W;
    n = tile / s.col_tiles;
#else
    ow0 = (tile % s.col_tiles) * TILE_W;
    tile /= s.col_tiles;
    oh0 = (tile % s.row_tiles) * ROWS;
    n = tile / s.row_tiles;
#endif
}

#ifdef KB_CBW
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done = 0;
    while (!done)
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done) : "r"(bar), "r"(parity) : "memory");
}
// Generic-proxy writes to shared memory made visible to the async proxy (wgmma's operand reads).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// A K-major shared-memory matrix descriptor without swizzle: start, LBO (the next core matrix along K) and SBO (the
// next 8 rows), each in 16-byte units.
__device__ __forceinline__ uint64_t desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return static_cast<uint64_t>((addr & 0x3ffff) >> 4) | (static_cast<uint64_t>((lbo >> 4) & 0x3fff) << 16) |
           (static_cast<uint64_t>((sbo >> 4) & 0x3fff) << 32);
}

// B's descriptor: no swizzle (LBO the next 4 channels, SBO the next 8 pixels), or CBW_SW32's.
__device__ __forceinline__ uint64_t bdesc(uint32_t addr) {
#if CBW_SW32
    const uint64_t bo = CBW_SW32 == 2 ? (addr >> 7) & 7 : 0;
    return static_cast<uint64_t>((addr & 0x3ffff) >> 4) | (1ull << 16) | (static_cast<uint64_t>(256 >> 4) << 32) |
           (bo << 49) | (3ull << 62);
#else
    return desc(addr, B_LBO, 128);
#endif
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
template <int kN>
__device__ __forceinline__ void fence_regs(float (&d)[kN]) {
#pragma unroll
    for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

#define CBW_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
                  "+f"(d[i + 6]), "+f"(d[i + 7])
#define CBW_R10(b) "%" #b "0, %" #b "1, %" #b "2, %" #b "3, %" #b "4, %" #b "5, %" #b "6, %" #b "7, %" #b "8, " \
                   "%" #b "9"
// d[64×128] (+)= a[64×8] · b[8×128] from shared memory (TF32 in, float32 accumulate); accumulate = 0: from zero.
__device__ __forceinline__ void mma(float (&d)[64], uint64_t da, uint64_t db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, " CBW_R10(1) ", " CBW_R10(2) ", " CBW_R10(3) ", " CBW_R10(4) ", "
        CBW_R10(5) ", %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}\n"
        : CBW_D8(0), CBW_D8(8), CBW_D8(16), CBW_D8(24), CBW_D8(32), CBW_D8(40), CBW_D8(48), CBW_D8(56)
        : "l"(da), "l"(db), "r"(accumulate));
}

// x = hi + lo: hi the nearest TF32 (ties away), lo the exact remainder (the tensor core reads its top 19 bits).
__device__ __forceinline__ void split(float x, float& hi, float& lo) {
    hi = __uint_as_float((__float_as_uint(x) + 0x1000u) & 0xffffe000u);
    lo = x - hi;
}

// The filter of channels co0 … co0+63 (zeros past C_out and C_in), split, and their bias: by all 384 threads.
__device__ __forceinline__ void stage_filter(unsigned char* sm, const float* __restrict__ w,
                                             const float* __restrict__ b, const Shape& s, int co0) {
    float* f_hi = reinterpret_cast<float*>(sm + FILTER_OFF);
    float* f_lo = reinterpret_cast<float*>(sm + FILTER_OFF + FILTER_PLANE);
    float* bias = reinterpret_cast<float*>(sm + BIAS_OFF);
    for (int i = threadIdx.x; i < K3 * K3 * CI * CO_B; i += THREADS) {  // i = ((tap·2 + h)·64 + co)·4 + c
        const int c4 = i & 3, co = (i >> 2) & (CO_B - 1), h = (i >> 8) & 1, tap = i >> 9;
        const int ci = 4 * h + c4, oc = co0 + co;
        const float v = oc < s.C_out && ci < s.C_in ? w[(static_cast<int64_t>(oc) * s.C_in + ci) * 9 + tap] : 0.f;
        float hi, lo;
        split(v, hi, lo);
        lo = __uint_as_float((__float_as_uint(lo) + 0x1000u) & 0xffffe000u);  // the filter's lo rounded too
        f_hi[i] = hi;
        f_lo[i] = lo;
    }
    if (threadIdx.x < CO_B)
        bias[threadIdx.x] = b != nullptr && co0 + threadIdx.x < s.C_out ? b[co0 + threadIdx.x] : 0.f;
}

// The producer warpgroup's part for one tile: input rows oh0 … oh0+2, pixels ow0 … ow0+129 of all 8 channels,
// split, into stage `st`; zeros outside the image and for channels ≥ C_in. Thread item = (h, row, pixel): 4 loads
// (one per channel, coalesced along the pixels), one 16-byte store per plane (conflict-free).
constexpr int ITEMS = 2 * IN_ROWS * IN_W, PER = (ITEMS + 127) / 128;

// kNR input rows from ih0 (the stage's 3; with CBW_RING 1, or 3 where a strip starts), thread item = (h, row,
// pixel): every load in flight at once.
template <int kNR>
__device__ __forceinline__ void load_rows(float (&v)[PER][4], const float* __restrict__ x, const Shape& s, int64_t n,
                                          int ih0, int ow0, int t) {
    const int64_t plane = static_cast<int64_t>(s.H) * s.W;
    const float* xn = x + n * s.C_in * plane;
#pragma unroll
    for (int k = 0; k < PER; ++k) {
        const int item = t + 128 * k;
        if (128 * k >= 2 * kNR * IN_W) break;
        const int h = item / (kNR * IN_W), row = item / IN_W % kNR, px = item % IN_W;
        const int ih = ih0 + row, iw = ow0 + px;
        const bool in = item < 2 * kNR * IN_W && ih < s.H && iw < s.W;
        const float* p = xn + (4 * h) * plane + static_cast<int64_t>(ih) * s.W + iw;
#pragma unroll
        for (int c = 0; c < 4; ++c) v[k][c] = in && 4 * h + c < s.C_in ? __ldg(p + c * plane) : 0.f;
    }
}
// The rows, split, into the stage at `planes` (rows 0 … kNR−1), or with CBW_RING into ring slots (q + row) % RING.
template <int kNR>
__device__ __forceinline__ void write_rows(unsigned char* planes, const float (&v)[PER][4], int q, int t) {
#pragma unroll
    for (int k = 0; k < PER; ++k) {
        const int item = t + 128 * k;
        if (item >= 2 * kNR * IN_W) break;
        const int h = item / (kNR * IN_W), row = item / IN_W % kNR, px = item % IN_W;
        float4 hi, lo;
        split(v[k][0], hi.x, lo.x);
        split(v[k][1], hi.y, lo.y);
        split(v[k][2], hi.z, lo.z);
        split(v[k][3], hi.w, lo.w);
#if CBW_RING
        const int off = b_off((q + row) % RING, px, h);
#else
        const int off = b_off(q + row, px, h);  // h * HALF_BYTES + (row * PIX + px) * 16 without CBW_SW32
#endif
        *reinterpret_cast<float4*>(planes + off) = hi;
        *reinterpret_cast<float4*>(planes + B_PLANE + off) = lo;
    }
}

// Taps t0 … t0+n−1's products into d, from zero, as one committed group: every tap's small terms, then their
// hi·hi (n = 1: lo·hi, hi·lo, hi·hi, the landed kernel's order).
// d (+)= a · b with a (64×8) from registers: warp w's lane (g, q) holds rows 16w + g, +8 at k = q, q + 4.
__device__ __forceinline__ void mma_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, " CBW_R10(1) ", " CBW_R10(2) ", " CBW_R10(3) ", " CBW_R10(4) ", "
        CBW_R10(5) ", %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
        : CBW_D8(0), CBW_D8(8), CBW_D8(16), CBW_D8(24), CBW_D8(32), CBW_D8(40), CBW_D8(48), CBW_D8(56)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate));
}
template <int kN>
__device__ __forceinline__ void issue_group_rs(float (&d)[64], const uint32_t (&rows)[3],
                                               const uint32_t (&ah)[9][4],
                                               const uint32_t (&al)[CBW_RS == 2 ? 1 : 9][4], uint32_t filt, int t0) {
    wg_fence();
#pragma unroll
    for (int i = 0; i < kN; ++i) {
        const int tap = t0 + i, kh = tap / K3, kw = CBW_KW0 ? 0 : tap % K3;
        const uint32_t b_hi = rows[kh] + kw * KW_BYTES, b_lo = b_hi + B_PLANE;
#if CBW_RS == 2  // A_lo from shared memory (its 36 registers do not fit beside t3's 166)
        mma(d, desc(filt + tap * TAP_BYTES + FILTER_PLANE, 1024, 128), bdesc(b_hi), i == 0 ? 0 : 1);
#else
        mma_rs(d, al[tap], bdesc(b_hi), i == 0 ? 0 : 1);
#endif
        mma_rs(d, ah[tap], bdesc(b_lo), 1);
    }
#pragma unroll
    for (int i = 0; i < kN; ++i) {
        const int tap = t0 + i, kh = tap / K3, kw = CBW_KW0 ? 0 : tap % K3;
        mma_rs(d, ah[tap], bdesc(rows[kh] + kw * KW_BYTES), 1);
    }
    wg_commit();
}
template <int kN>
__device__ __forceinline__ void issue_group(float (&d)[64], const uint32_t (&rows)[3], uint32_t filt, int t0) {
    wg_fence();
#pragma unroll
    for (int i = 0; i < kN; ++i) {
        const int tap = t0 + i, kh = tap / K3, kw = CBW_KW0 ? 0 : tap % K3;
        const uint32_t b_hi = rows[kh] + kw * KW_BYTES, b_lo = b_hi + B_PLANE;
        const uint32_t a_hi = filt + tap * TAP_BYTES, a_lo = a_hi + FILTER_PLANE;
        mma(d, desc(a_lo, 1024, 128), bdesc(b_hi), i == 0 ? 0 : 1);
        mma(d, desc(a_hi, 1024, 128), bdesc(b_lo), 1);
    }
#pragma unroll
    for (int i = 0; i < kN; ++i) {
        const int tap = t0 + i, kh = tap / K3, kw = CBW_KW0 ? 0 : tap % K3;
        const uint32_t b_hi = rows[kh] + kw * KW_BYTES, a_hi = filt + tap * TAP_BYTES;
        mma(d, desc(a_hi, 1024, 128), bdesc(b_hi), 1);
    }
    wg_commit();
}
constexpr int GROUPS = (K3 * K3 + CBW_TAPS - 1) / CBW_TAPS;
// Groups that issue store parts: all but group 0 (see the header); t9, one group, issues all 8 after its commit.
constexpr int STORE_GROUPS = GROUPS > 1 ? GROUPS - 1 : 1;
static_assert((K3 * K3) % CBW_TAPS == 0 && 8 % STORE_GROUPS == 0, "groups of equal size; 8 store parts over them");
constexpr int PARTS_PER_GROUP = 8 / STORE_GROUPS;

// A row staged in shared memory, stored during the next tile's taps: thread t writes pixels px = 2·(t % 64), +1
// of channels 2k + t / 64 (a warp: 32 neighbouring pairs of one channel, 256 contiguous bytes per store).
#if CBW_STORE_LDS
using ORef = int;  // an index into the consumer's row, read with 32-bit shared-memory addresses (LDS)
#define CBW_AT(p, row, k) ((row) + (p).o + (k) * 2 * OUT_PITCH)
#define CBW_ROW_REF(out) 0
#else
using ORef = const float*;  // a generic pointer (the landed kernel's: LD with 64-bit addresses)
#define CBW_AT(p, row, k) ((p).o + (k) * 2 * OUT_PITCH)
#define CBW_ROW_REF(out) (out)
#endif
struct Pending {
    float* y;         // this thread's first output (channel t / 64, pixel px); null: nothing to store
    ORef o;           // the same value in the shared-memory row
    int64_t step;     // two channel planes
    int rows;         // k < rows: channel 2k + t / 64 exists
    bool pair;        // both pixels valid and y 8-byte aligned there: one float2 store
    bool second;      // pixel px + 1 valid
    bool fast;        // pair, and all 32 channel pairs exist (CBW_STORE_FAST)
};
__device__ __forceinline__ Pending pending_row(float* yrow, const float* out, int valid, int channels, int64_t oplane,
                                               bool pairs, int t) {
    const int px = 2 * (t % 64), c = t / 64;
    if (px >= valid) return Pending{nullptr, ORef{}, 0, 0, false, false, false};
    const int rows = (channels - c + 1) / 2;
    const bool pair = pairs && px + 1 < valid;
    return Pending{yrow + c * oplane + px, CBW_ROW_REF(out) + c * OUT_PITCH + px, 2 * oplane, rows, pair, px + 1 < valid,
                   pair && rows == CO_B / 2};
}
// Part `part` (of 8): k = 4·part … 4·part + 3.
__device__ __forceinline__ void store_part(const Pending& p, const float* row, int part) {
#if CBW_STORE_FAST == 2
    if (p.fast) {  // no branch per store
#pragma unroll
        for (int k = 4 * part; k < 4 * part + 4; ++k)
            *reinterpret_cast<float2*>(p.y + k * p.step) = *reinterpret_cast<const float2*>(CBW_AT(p, row, k));
        return;
    }
#endif
    if (p.y == nullptr) return;
#if CBW_STORE_FAST >= 1
    // Branch-free over k: a channel pair past the last stores the last one's values again, to the same address.
#pragma unroll
    for (int k = 4 * part; k < 4 * part + 4; ++k) {
        const int kk = min(k, p.rows - 1);
        const float2 v = *reinterpret_cast<const float2*>(CBW_AT(p, row, kk));
        float* yc = p.y + kk * p.step;
        if (p.pair) {
            *reinterpret_cast<float2*>(yc) = v;
        } else {
            yc[0] = v.x;
            if (p.second) yc[1] = v.y;
        }
    }
#else
#pragma unroll
    for (int k = 4 * part; k < 4 * part + 4; ++k) {
        if (k >= p.rows) return;
        const float2 v = *reinterpret_cast<const float2*>(CBW_AT(p, row, k));
        float* yc = p.y + k * p.step;
        if (p.pair) {
            *reinterpret_cast<float2*>(yc) = v;
        } else {
            yc[0] = v.x;
            if (p.second) yc[1] = v.y;
        }
    }
#endif
}

__device__ __forceinline__ void add_into(float (&acc)[64], float (&t)[64]) {
    fence_regs(t);
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] += t[i];
}
#endif  // KB_CBW

// guard: null, or run only when *guard == run_if (conv_moments.cuh's flag). Grid (blocks per channel block, channel
// blocks); block (·, cb) walks the tiles of channel block cb.
__global__ void __launch_bounds__(THREADS, 1)
conv3x3_wgmma_kernel(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
                     float* __restrict__ y, Shape s, const unsigned* guard, unsigned run_if, double* stats) {
#ifdef KB_CBW
    if (guard != nullptr && *guard != run_if) return;  // block-uniform, before any barrier
    extern __shared__ __align__(128) unsigned char sm_raw[];
#if CBW_SW32  // B's 256-byte atoms on 256-byte boundaries (the swizzle is a function of the address)
    const uint32_t base = (smem_u32(sm_raw) + 255) & ~255u;
    unsigned char* sm = sm_raw + (base - smem_u32(sm_raw));
#else
    unsigned char* sm = sm_raw;
    const uint32_t base = smem_u32(sm);
#endif
    const uint32_t bars = base + BAR_OFF;  // full[STAGES], then empty[STAGES]
    const int co0 = blockIdx.y * CO_B;
#if CBW_RING  // this block's run of tiles [lo, hi)
    const int lo = static_cast<int>(static_cast<int64_t>(blockIdx.x) * s.tiles_per_cb / gridDim.x);
    const int hi = static_cast<int>(static_cast<int64_t>(blockIdx.x + 1) * s.tiles_per_cb / gridDim.x);
#endif
    const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
    if (threadIdx.x == 0) {
        for (int i = 0; i < STAGES; ++i) {
            mbar_init(bars + 8 * i, 128);                // full: every producer thread has written its part
            mbar_init(bars + 8 * (STAGES + i), 128);     // empty: its consumer's products are done
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    stage_filter(sm, w, b, s, co0);
    fence_proxy_async();
    __syncthreads();

    if (wg == 0) {  // the producer
#if CBW_RS
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(CBW_RS_PRODUCER) : "memory");
#endif
        int it = 0;
        float v[PER][4];
#if CBW_STATS
        float q2[2][4] = {}, q4[2][4] = {};  // Σx², Σx⁴ of channel 4h + c, each input counted once
#endif
        // Tile `tile`, loaded into vv, into stage it % STAGES once its consumer has released it.
        auto produce = [&](const float (&vv)[PER][4], int tile) {
            const int st = it % STAGES;
            mbar_wait(bars + 8 * (STAGES + st), ((it / STAGES) & 1) ^ 1);
            int64_t n;
            int oh0, ow0;
            tile_coords(tile, s, n, oh0, ow0);
            if (CBW_DIAG != 2 && CBW_DIAG != 5) write_rows<IN_ROWS>(sm + st * STAGE_BYTES, vv, 0, t);
#if CBW_STATS
            if (blockIdx.y == 0) {  // one channel block counts the input
#pragma unroll
                for (int k = 0; k < PER; ++k) {
                    const int item = t + 128 * k;
                    const int h = item / (IN_ROWS * IN_W), r = item / IN_W % IN_ROWS, px = item % IN_W;
                    // input row oh0 (all three in the last output row), columns of this tile (all in the last)
                    if (item < ITEMS && (r == 0 || oh0 == s.HO - 1) && (px < TILE_W || ow0 + TILE_W >= s.WO)) {
#pragma unroll
                        for (int c = 0; c < 4; ++c) {
                            const float sq = vv[k][c] * vv[k][c];
                            if (h == 0) q2[0][c] += sq, q4[0][c] = fmaf(sq, sq, q4[0][c]);
                            else q2[1][c] += sq, q4[1][c] = fmaf(sq, sq, q4[1][c]);
                        }
                    }
                }
            }
#endif
            fence_proxy_async();
            mbar_arrive(bars + 8 * st);
            ++it;
        };
        auto load = [&](float (&vv)[PER][4], int tile) {
            if (CBW_DIAG == 2 || CBW_DIAG == 5) return;
            int64_t n;
            int oh0, ow0;
            tile_coords(tile, s, n, oh0, ow0);
            load_rows<IN_ROWS>(vv, x, s, n, oh0, ow0, t);
        };
#if CBW_RING
        int q = 0;  // input rows staged so far: the next one's sequence number
        for (int i = 0; lo + i < hi; ++i) {
            int64_t n;
            int oh0, ow0;
            tile_coords(lo + i, s, n, oh0, ow0);
            const bool start = i == 0 || oh0 == 0;  // a strip starts: all three rows
            if (CBW_DIAG != 2 && CBW_DIAG != 5) {
                if (start) load_rows<3>(v, x, s, n, oh0, ow0, t);
                else load_rows<1>(v, x, s, n, oh0 + 2, ow0, t);
            }
            const int st = i % STAGES;
            mbar_wait(bars + 8 * (STAGES + st), ((i / STAGES) & 1) ^ 1);  // tiles ≤ i − STAGES are done
            if (CBW_DIAG != 2 && CBW_DIAG != 5) {
                if (start) write_rows<3>(sm, v, q, t);
                else write_rows<1>(sm, v, q, t);
            }
            q += start ? 3 : 1;
            fence_proxy_async();
            mbar_arrive(bars + 8 * st);
        }
#elif CBW_PIPE == 2
        float v2[PER][4];
        int tile = blockIdx.x;
        if (tile < s.tiles_per_cb) load(v, tile);
        while (tile < s.tiles_per_cb) {  // two tiles a trip: v and v2 alternate (registers need fixed names)
            int next = tile + gridDim.x;
            if (next < s.tiles_per_cb) load(v2, next);
            produce(v, tile);
            tile = next;
            if (tile >= s.tiles_per_cb) break;
            next = tile + gridDim.x;
            if (next < s.tiles_per_cb) load(v, next);
            produce(v2, tile);
            tile = next;
        }
#else
        for (int tile = blockIdx.x; tile < s.tiles_per_cb; tile += gridDim.x) {
            const int st = it % STAGES;
            mbar_wait(bars + 8 * (STAGES + st), ((it / STAGES) & 1) ^ 1);  // as the landed kernel: wait, then load
            load(v, tile);
            produce(v, tile);
        }
#endif
#if CBW_STATS
        if (blockIdx.y == 0 && stats != nullptr) {
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    float a = q2[h][c], b4 = q4[h][c];
#pragma unroll
                    for (int o = 16; o > 0; o >>= 1)
                        a += __shfl_xor_sync(0xffffffffu, a, o), b4 += __shfl_xor_sync(0xffffffffu, b4, o);
                    if (t % 32 == 0 && 4 * h + c < s.C_in) {
                        atomicAdd(stats + 4 * h + c, static_cast<double>(a));
                        atomicAdd(stats + s.C_in + 4 * h + c, static_cast<double>(b4));
                    }
                }
        }
#endif
        return;
    }
    const int cw = wg - 1;  // this consumer takes the block's tiles cw, cw + 2, cw + 4, …
    const int warp = t / 32, lane = t % 32;
    const int r0 = 16 * warp + lane / 4, c0 = 2 * (lane % 4);  // d[4j + e]: channel r0 (+8), pixel 8j + c0 (+1)
    const float* bias = reinterpret_cast<const float*>(sm + BIAS_OFF);
    const float b0 = bias[r0], b1 = bias[r0 + 8];
    const uint32_t filt = base + FILTER_OFF;
#if CBW_RS
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CBW_RS_CONSUMER) : "memory");
    uint32_t ah[9][4], al[CBW_RS == 2 ? 1 : 9][4];  // the filter's A fragments, every tap, hi (and lo) planes
    {
        const uint32_t* f_hi = reinterpret_cast<const uint32_t*>(sm + FILTER_OFF);
        const uint32_t* f_lo = reinterpret_cast<const uint32_t*>(sm + FILTER_OFF + FILTER_PLANE);
        const int q = lane % 4;
#pragma unroll
        for (int tap = 0; tap < 9; ++tap)
#pragma unroll
            for (int e = 0; e < 4; ++e) {  // rows r0, r0 + 8 (e & 1); k = q, q + 4 (e >> 1): [tap][h][co][4]
                const int off = tap * 512 + (e >> 1) * 256 + (r0 + 8 * (e & 1)) * 4 + q;
                ah[tap][e] = f_hi[off];
                if (CBW_RS != 2) al[CBW_RS == 2 ? 0 : tap][e] = f_lo[off];
            }
    }
#endif
    const int64_t oplane = static_cast<int64_t>(s.HO) * s.WO;
    const float* row = reinterpret_cast<const float*>(sm + OUT_OFF + cw * OUT_BYTES);  // this consumer's row
    Pending pend{nullptr, ORef{}, 0, 0, false, false, false};  // the last row, staged in shared memory
#if CBW_STATS
    // Σy² of channels co0 + r0 (y2[0]) and co0 + r0 + 8 (y2[1]) over this thread's outputs, in YC independent chains
    // (CBW_STATS 2: 2; 1: one chain of 32 dependent FMAs a tile per channel, on the consumers' critical path)
    constexpr int YC = CBW_STATS == 2 ? 2 : 1;
    float y2[2][YC] = {};
#endif
// excerpt: consumer
#if CBW_RING
    for (int it = cw, tile = lo + cw; tile < hi; it += 2, tile += 2) {
#else
    for (int it = cw, tile = blockIdx.x + cw * gridDim.x; tile < s.tiles_per_cb; it += 2, tile += 2 * gridDim.x) {
#endif
        const int st = it % STAGES;
        int64_t n;
        int oh, ow0;
        tile_coords(tile, s, n, oh, ow0);
        mbar_wait(bars + 8 * st, (it / STAGES) & 1);
        if (CBW_DIAG == 1) {
            mbar_arrive(bars + 8 * (STAGES + st));
            continue;
        }
#if CBW_RING
        // the tile's first row: rows staged before it, less 2 unless its strip starts here (producer's count)
        const int q = it + 2 * (tile / s.row_tiles - lo / s.row_tiles);
        const uint32_t rows[3] = {base + (q % RING) * ROW_BYTES, base + ((q + 1) % RING) * ROW_BYTES,
                                  base + ((q + 2) % RING) * ROW_BYTES};
#else
        const uint32_t stage = base + st * STAGE_BYTES;
        const uint32_t rows[3] = {stage, stage + ROW_BYTES, stage + 2 * ROW_BYTES};
#endif
        float acc[64], d[64];
#pragma unroll
        for (int j = 0; j < 16; ++j) acc[4 * j] = acc[4 * j + 1] = b0, acc[4 * j + 2] = acc[4 * j + 3] = b1;
#pragma unroll
        for (int g = 0; g < GROUPS; ++g) {
#if CBW_RS
            issue_group_rs<CBW_TAPS>(d, rows, ah, al, filt, g * CBW_TAPS);
#else
            issue_group<CBW_TAPS>(d, rows, filt, g * CBW_TAPS);
#endif
#pragma unroll
            for (int q = 0; q < PARTS_PER_GROUP; ++q)  // while the tensor core multiplies (none in group 0)
                if (CBW_DIAG != 3 && CBW_DIAG != 5 && (GROUPS == 1 || g >= 1))
                    store_part(pend, row, (GROUPS == 1 ? 0 : g - 1) * PARTS_PER_GROUP + q);
            wg_wait<0>();
            add_into(acc, d);
        }
        mbar_arrive(bars + 8 * (STAGES + st));  // the stage is free for the producer
#if CBW_STATS
        {
            const int valid = min(TILE_W, s.WO - ow0);
#pragma unroll
            for (int j = 0; j < 16; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    if (valid == TILE_W || 8 * j + c0 + (e & 1) < valid)
                        y2[e >> 1][j % YC] = fmaf(acc[4 * j + e], acc[4 * j + e], y2[e >> 1][j % YC]);
        }
#endif
        if (CBW_DIAG == 3 || CBW_DIAG == 5) {  // every sum kept live (its FADDs issued), nothing stored: a
            // store ptxas cannot rule out (one NaN pattern) keeps all 64; an empty asm would not (no PTX use).
            // Volatile stores to y[0]: none can be dropped, and none lands outside y.
            if (__float_as_uint(acc[0]) == 0x7fc01234u) {
                volatile float* y0 = y;
#pragma unroll
                for (int i = 0; i < 64; ++i) *y0 = acc[i];
            }
            continue;
        }
        float* yrow = y + (n * s.C_out + co0) * oplane + static_cast<int64_t>(oh) * s.WO;
        // The row into shared memory once every warp has stored its part of the last one; its global stores run
        // during the next tile's taps (store_part), the last row's after the loop.
        asm volatile("bar.sync %0, 128;\n" ::"r"(1 + cw) : "memory");
        float* out = reinterpret_cast<float*>(sm + OUT_OFF + cw * OUT_BYTES);
#pragma unroll
        for (int j = 0; j < 16; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e)
                *reinterpret_cast<float2*>(out + (r0 + 8 * e) * OUT_PITCH + 8 * j + c0) =
                    make_float2(acc[4 * j + 2 * e], acc[4 * j + 2 * e + 1]);
        asm volatile("bar.sync %0, 128;\n" ::"r"(1 + cw) : "memory");
        pend = pending_row(yrow + ow0, out, min(TILE_W, s.WO - ow0), min(CO_B, s.C_out - co0), oplane, s.y_even, t);
    }
// end excerpt: consumer
#pragma unroll
    for (int part = 0; part < 8; ++part) store_part(pend, row, part);
#if CBW_STATS
    if (stats != nullptr) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            float a = 0.f;
#pragma unroll
            for (int k = 0; k < YC; ++k) a += y2[e][k];
            a += __shfl_xor_sync(0xffffffffu, a, 1);
            a += __shfl_xor_sync(0xffffffffu, a, 2);
            const int c = co0 + r0 + 8 * e;
            if (lane % 4 == 0 && c < s.C_out) atomicAdd(stats + 2 * s.C_in + c, static_cast<double>(a));
        }
    }
#endif
#endif  // KB_CBW
}

inline int64_t tiles_per_cb(int64_t N, int H, int W) {
    const int64_t ho = H - K3 + 1, wo = W - K3 + 1;
    if (N <= 0 || ho <= 0 || wo <= 0) return 0;
    return N * ((ho + ROWS - 1) / ROWS) * ((wo + TILE_W - 1) / TILE_W);
}

// Whether the current GPU runs this kernel: an sm_90 GPU, and the binary loaded for it built for sm_90a (asked of
// the device code once per device).
static cudaError_t available(bool* out) {
    static int cache[64] = {};  // 0 not asked, 1 no, 2 yes
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) return err;
    int& c = cache[device % 64];
    if (c == 0) {
        int major = 0, minor = 0, built = 0;
        err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
        if (err == cudaSuccess) err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
        if (err == cudaSuccess && major == 9 && minor == 0) err = cudaMemcpyFromSymbol(&built, g_built, sizeof(int));
        if (err != cudaSuccess) return err;
        c = built ? 2 : 1;
    }
    *out = c == 2;
    return cudaSuccess;
}

// y = conv(x, w) + b through wgmma; C_in ≤ 8, an sm_90 GPU and an sm_90a build (the caller checks: available).
static cudaError_t conv(const float* x, const float* w, const float* b, float* y, int64_t N, int C_in, int H, int W,
                        int C_out, const unsigned* guard, unsigned run_if, cudaStream_t stream,
                        double* stats = nullptr) {
    const int64_t per_cb = tiles_per_cb(N, H, W);
    if (per_cb == 0 || C_out <= 0) return cudaSuccess;
    if (per_cb > INT32_MAX || C_in < 1 || C_in > CI) return cudaErrorInvalidValue;
    Shape s{static_cast<int>(N), C_in, H, W, C_out, H - K3 + 1, W - K3 + 1, 0, 0, static_cast<int>(per_cb),
            (reinterpret_cast<uintptr_t>(y) & 7) == 0 && (W - K3 + 1) % 2 == 0};
    s.row_tiles = (s.HO + ROWS - 1) / ROWS;
    s.col_tiles = (s.WO + TILE_W - 1) / TILE_W;
    static int sms[64] = {};
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) return err;
    if (sms[device % 64] == 0) {
        err = cudaFuncSetAttribute(conv3x3_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES);
        if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms[device % 64], cudaDevAttrMultiProcessorCount, device);
        if (err != cudaSuccess) return err;
    }
    const int cbs = (C_out + CO_B - 1) / CO_B;
    if (cbs > 65535) return cudaErrorInvalidValue;
    int per = sms[device % 64] / cbs;
    per = per < 1 ? 1 : per;
    per = per < s.tiles_per_cb ? per : s.tiles_per_cb;
    conv3x3_wgmma_kernel<<<dim3(per, cbs), THREADS, SMEM_BYTES, stream>>>(x, w, b, y, s, guard, run_if, stats);
    return cudaGetLastError();
}

}  // namespace CBW_NS

#undef CBW_NS
#undef CBW_TAPS
#undef CBW_STORE_FAST
#undef CBW_STORE_LDS
#undef CBW_STATS
#undef CBW_PIPE
#undef CBW_DIAG
#undef CBW_KW0
#undef CBW_RS
#undef CBW_RS_PRODUCER
#undef CBW_PIX
#undef CBW_RING
#undef CBW_SW32
#undef CBW_RS_CONSUMER
#undef CBW_AT
#undef CBW_ROW_REF
#undef CBW_D8
#undef CBW_R10
