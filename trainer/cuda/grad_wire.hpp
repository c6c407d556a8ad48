// communication_data_type on GPU ranks: the type gradients travel in between ranks. 16 bits (bf16 or
// fp16) halve the bytes on the wire, at the price of two roundings per reduction (NCCL adds 16-bit
// values in fp32 and rounds each sum); fp32 travels as it is. trainer/grad_wire.hpp is the CPU ranks'
// version of the same rounding.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>

#include "ckpt/tensor_table.hpp"

namespace shardkit::trainer::cuda {

// NCCL's name of the type: ncclFloat, ncclBfloat16 or ncclHalf.
ncclDataType_t nccl_type(ckpt::DType wire) noexcept;

// Bytes per element on the wire: 4 for fp32, 2 for bf16 and fp16.
size_t wire_bytes(ckpt::DType wire) noexcept;

// out[0, n) = in in the wire's type: copied as it is (fp32) or rounded to 16 bits (nearest even).
void to_wire(void* out, ckpt::DType wire, const float* in, int64_t n, cudaStream_t st);

// out = in, or out += in with `add`, in being n values of the wire's type (widened to fp32).
void from_wire(float* out, ckpt::DType wire, const void* in, int64_t n, bool add, cudaStream_t st);

}  // namespace shardkit::trainer::cuda
