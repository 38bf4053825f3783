// tf32.cuh — the 3xTF32 building blocks shared by the tensor-core kernels (gemm_3xtf32.cu, conv_tf32.cuh):
// the split of a float into two TF32 parts and one mma.sync.m16n8k8 TF32 product.
// mma.sync with TF32 operands needs sm_80; an older target compiles these to placeholders that the callers
// never reach (their bindings refuse such GPUs, or choose the FFMA path there).
#pragma once
#include <cstdint>

namespace kb {

// excerpt: split
// x = hi + lo, both TF32 (hi: x rounded to nearest TF32; lo: the remainder, rounded again).
__device__ __forceinline__ void split(float x, uint32_t& hi, uint32_t& lo) {
#if __CUDA_ARCH__ >= 800
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(hi) : "f"(x));
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(lo) : "f"(x - __uint_as_float(hi)));
#else
    hi = __float_as_uint(x), lo = 0u;
#endif
}

// The same split in three instructions, for the operand split in an inner loop. hi: x rounded to the nearest
// TF32, ties away, by adding half a TF32 ulp to the bits and clearing the 13 dropped ones — what cvt.rna does for
// finite x (on sm_90 ptxas compiles cvt.rna.tf32.f32 to a longer sequence that keeps NaN a NaN). lo: the
// remainder x − hi, exact, its 13 low bits left in place: the tensor core reads only the top 19 bits of a TF32
// operand register, so it sees lo truncated to TF32 (|error| < 2^-22·|x|) with no instruction spent to clear
// them. tests/test_conv3d_gn_mean.py checks on the GPU that clearing them (-DKB_TF32_CLEAR_LOW_BITS) changes
// no result. NaN stays NaN: x − hi is NaN whenever x is not finite.
__device__ __forceinline__ void split_fast(float x, uint32_t& hi, uint32_t& lo) {
    hi = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
    lo = __float_as_uint(x - __uint_as_float(hi));
#ifdef KB_TF32_CLEAR_LOW_BITS
    lo &= 0xffffe000u;
#endif
}

// acc += a·b for one 16×8×8 tile on the tensor cores (TF32 inputs, float32 accumulation).
__device__ __forceinline__ void mma(float (&acc)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}
// end excerpt: split

// d = a·b for one 16×8×8 tile (the accumulator starts from zero: no instructions to clear it).
__device__ __forceinline__ void mma0(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%10,%10,%10};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(0.f));
#else
    d[0] = d[1] = d[2] = d[3] = 0.f;
#endif
}

}  // namespace kb
