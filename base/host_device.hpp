// SHARDKIT_HOST_DEVICE marks a function that compiles for the host and, under nvcc, for the device too:
// arithmetic that host code and kernels must agree on bit for bit lives in one such definition.
#pragma once

#if defined(__CUDACC__)
#define SHARDKIT_HOST_DEVICE __host__ __device__
#else
#define SHARDKIT_HOST_DEVICE
#endif
