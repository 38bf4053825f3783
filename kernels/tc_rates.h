// tc_rates.h — when the tensor cores' 3xTF32 beats the CUDA cores' FFMA, by GPU architecture (torch-free).
//
// 3xTF32 issues three TF32 tensor-core products for each float32 one, so it is faster than FFMA only where
// dense TF32 runs well over 3× the FP32 FMA rate. The table gives that ratio per SM and clock, from NVIDIA's
// datasheets (dense, no sparsity; datacenter parts where a capability has both):
//   sm_80 A100         TF32 156 / FP32 19.5 TFLOP/s  ≈ 8
//   sm_86 A10, A40     62.5 / 31.2                    ≈ 2    (GeForce RTX 30: ≈ 1)
//   sm_87 Jetson Orin  as sm_86                       ≈ 2
//   sm_89 L4, L40S     60 / 30.3, 183 / 91.6          ≈ 2    (GeForce RTX 40: ≈ 1)
//   sm_90 H100, H200   495 / 67                       ≈ 7.4
//   sm_100, sm_103 B200, B300   ≈ 1,100 / 80          ≈ 14
//   sm_120 RTX 50, RTX PRO 6000 (≈ 1 to 2)            ≈ 1.5
//   sm_75 and older: no TF32 (0).
// An architecture missing from the table counts as 0: FFMA, which runs everywhere at a known rate.
#pragma once

// Dense TF32 tensor-core FLOP rate over the FP32 FMA rate, per SM and clock, for compute capability
// major.minor (0 where there is no TF32 or the architecture is not in the table).
inline double kb_tf32_over_fp32(int major, int minor) {
    const int cc = 10 * major + minor;
    switch (cc) {
        case 80: return 8.0;
        case 86: case 87: case 89: return 2.0;
        case 90: return 7.4;
        case 100: case 103: return 14.0;
        case 120: case 121: return 1.5;
        default: return 0.0;
    }
}

// math="auto": 3xTF32 where three TF32 products take less time than one FFMA product would — the ratio at
// least 3.5, leaving room for the split's extra instructions — else FFMA.
inline bool kb_3xtf32_pays(int major, int minor) { return kb_tf32_over_fp32(major, minor) >= 3.5; }
