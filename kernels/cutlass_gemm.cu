// cutlass_gemm.cu — CUTLASS's Ampere TF32 and 3xTF32 GEMMs, the yardstick beside gemm_3xtf32.cu.
//
// Nothing here is the book's own algorithm: cutlass::gemm::device::Gemm with the operator tag chooses the
// arithmetic. OpMultiplyAddFastF32 (mma_tensor_op_fast_f32.h) splits each operand into big + small TF32
// parts — big by truncation (round toward zero), small = (x − big) rounded to nearest — and issues
// small·big, big·small and big·big. Its mainloop stages the accumulation for this operator
// (kStagedAccumulation in mma_multistage.h): each block k-tile (BK deep) sums into a fresh accumulator
// inside the mma.sync, which then joins the running sum by a float32 add — version 2's remedy of
// gemm_3xtf32.cu, at one add per BK-deep tile. OpMultiplyAdd is plain TF32 (operands rounded to nearest).
#include <cutlass/cutlass.h>
#include <cutlass/gemm/device/gemm.h>

#include "cutlass_gemm.h"

namespace {

template <int BM, int BN, int BK, int WM, int WN, int STAGES, typename Op>
struct Tile {
    static constexpr int shape[6] = {BM, BN, BK, WM, WN, STAGES};
    using Gemm = cutlass::gemm::device::Gemm<
        float, cutlass::layout::RowMajor,                // A
        float, cutlass::layout::RowMajor,                // B
        float, cutlass::layout::RowMajor,                // C, D
        float,                                           // accumulator
        cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
        cutlass::gemm::GemmShape<BM, BN, BK>, cutlass::gemm::GemmShape<WM, WN, BK>,
        cutlass::gemm::GemmShape<16, 8, 8>,              // mma.sync m16n8k8, TF32
        cutlass::epilogue::thread::LinearCombination<float, 4, float, float>,
        cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<8>,
        STAGES, 4, 4, false, Op>;
};

using Fast = cutlass::arch::OpMultiplyAddFastF32;
using Plain = cutlass::arch::OpMultiplyAdd;
// 3xTF32: CUTLASS's example 27 tile first, then larger blocks of the same 64×32 warp tile (a 64×64 warp tile
// needs more than 255 registers with the split's big and small fragments, and spills ≈ 1 KiB per thread).
using T3a = Tile<128, 64, 16, 64, 32, 3, Fast>;
using T3b = Tile<128, 128, 16, 64, 32, 3, Fast>;
using T3c = Tile<256, 64, 16, 64, 32, 3, Fast>;
// Plain TF32.
using T1a = Tile<128, 128, 32, 64, 64, 3, Plain>;
using T1b = Tile<256, 128, 32, 64, 64, 3, Plain>;

template <typename T>
cudaError_t run(const float* a, const float* b, float* c, int M, int N, int K, cudaStream_t stream) {
    using Gemm = typename T::Gemm;
    typename Gemm::Arguments args({M, N, K}, {a, K}, {b, N}, {c, N}, {c, N}, {1.0f, 0.0f});
    Gemm op;
    if (op.can_implement(args) != cutlass::Status::kSuccess) return cudaErrorInvalidValue;
    if (Gemm::get_workspace_size(args) != 0) return cudaErrorInvalidValue;  // split-K 1 needs none
    if (op.initialize(args, nullptr, stream) != cutlass::Status::kSuccess) return cudaErrorInvalidConfiguration;
    if (op(stream) != cutlass::Status::kSuccess) return cudaErrorLaunchFailure;
    return cudaGetLastError();
}

}  // namespace

int cutlass_gemm_tiles(int passes) { return passes == 3 ? 3 : 2; }

void cutlass_gemm_tile(int passes, int tile, int shape[6]) {
    const int* s = passes == 3 ? (tile == 0 ? T3a::shape : tile == 1 ? T3b::shape : T3c::shape)
                               : (tile == 0 ? T1a::shape : T1b::shape);
    for (int i = 0; i < 6; ++i) shape[i] = s[i];
}

cudaError_t launch_cutlass_gemm(const float* a, const float* b, float* c, int M, int N, int K, int passes, int tile,
                                cudaStream_t stream) {
    if (passes == 3) {
        if (tile == 0) return run<T3a>(a, b, c, M, N, K, stream);
        if (tile == 1) return run<T3b>(a, b, c, M, N, K, stream);
        if (tile == 2) return run<T3c>(a, b, c, M, N, K, stream);
    } else if (passes == 1) {
        if (tile == 0) return run<T1a>(a, b, c, M, N, K, stream);
        if (tile == 1) return run<T1b>(a, b, c, M, N, K, stream);
    }
    return cudaErrorInvalidValue;
}
