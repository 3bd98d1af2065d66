// Shared by the CPU and CUDA builds of the per-row kernels: functions marked
// AM_HOST_DEVICE compile for both, so the two back ends run one algorithm.
#pragma once

#if defined(__CUDACC__)
#define AM_HOST_DEVICE __host__ __device__
#else
#define AM_HOST_DEVICE
#endif
