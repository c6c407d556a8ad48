#include "trainer/grad_wire.hpp"

#include "ckpt/dtype_convert.hpp"

namespace shardkit::trainer {

void round_to_wire(std::span<float> values, ckpt::DType wire) {
  if (wire == ckpt::DType::kBF16) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < values.size(); ++i) values[i] = ckpt::bf16_to_fp32(ckpt::fp32_to_bf16(values[i]));
  } else if (wire == ckpt::DType::kF16) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < values.size(); ++i) values[i] = ckpt::fp16_to_fp32(ckpt::fp32_to_fp16(values[i]));
  }
}

}  // namespace shardkit::trainer
