// RN_HD marks functions that compile for both the host and a CUDA device.
#pragma once

#if defined(__CUDACC__)
#define RN_HD __host__ __device__ __forceinline__
#else
#define RN_HD inline
#endif
