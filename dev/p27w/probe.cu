// dev/p27w/probe.cu — compiles dev/p27w/conv3d_wgmma.cuh alone for nvcc's resource report and SASS.
#include "conv3d_wgmma.cuh"
