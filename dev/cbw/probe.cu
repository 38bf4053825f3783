// dev/cbw/probe.cu — compiles dev/cbw/conv_wgmma_x.cuh alone (torch-free) for nvcc's resource report and SASS.
#include "conv_wgmma_x.cuh"
