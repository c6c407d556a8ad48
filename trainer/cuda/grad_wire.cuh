// communication_data_type on GPU ranks: gradients are narrowed to bf16 or fp16 before an NCCL
// reduction and widened after it -- half the bytes on the wire, at the price of two roundings per
// reduction (NCCL adds 16-bit values in fp32 and rounds each sum). fp32 travels as it is and needs
// neither. trainer/grad_wire.hpp is the CPU ranks' version of the same rounding.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>

#include "ckpt/tensor_table.hpp"

namespace shardkit::trainer::cuda {

// NCCL's name of the type: ncclFloat, ncclBfloat16 or ncclHalf.
ncclDataType_t nccl_type(ckpt::DType wire) noexcept;

// out[0, n) = in rounded to the 16-bit `wire` type (nearest even), as raw 16-bit values.
void narrow_to_wire(uint16_t* out, ckpt::DType wire, const float* in, int64_t n, cudaStream_t st);

// out = in, or out += in with `add`, in (16-bit `wire` values) widened to fp32.
void widen_from_wire(float* out, ckpt::DType wire, const uint16_t* in, int64_t n, bool add, cudaStream_t st);

}  // namespace shardkit::trainer::cuda
