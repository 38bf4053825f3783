// dev/edge/probe.cu — compiles the candidate alone for nvcc's resource report.
#include "edge_multi.cuh"
template cudaError_t edgem::edge<4>(const float*, const cbm::MShape&, double*, cudaStream_t);
template cudaError_t edgem::edge<8>(const float*, const cbm::MShape&, double*, cudaStream_t);
