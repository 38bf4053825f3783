// nvcc -cubin -gencode=arch=compute_90a,code=sm_90a -Xptxas -v dev/mw/probe.cu: the kernel's resources.
#include "moments_wgmma.cuh"
