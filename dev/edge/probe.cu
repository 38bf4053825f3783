// dev/edge/probe.cu — compiles the candidate alone for nvcc's resource report (its kernels are not templates).
#include "edge_multi.cuh"
