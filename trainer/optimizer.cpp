#include "trainer/optimizer.hpp"

#include <algorithm>

#include "base/error.hpp"
#include "ckpt/dtype_convert.hpp"
#include "trainer/adamw.hpp"
#include "trainer/lion.hpp"
#include "trainer/update_blocks.hpp"

namespace shardkit::trainer {

const std::vector<const Optimizer*>& optimizers() {
  static const std::vector<const Optimizer*> list{
      &adamw_optimizer(),
      &lion_optimizer(),
  };
  return list;
}

const Optimizer& optimizer(OptimizerKind kind) {
  for (const Optimizer* o : optimizers()) {
    if (o->kind == kind) return *o;
  }
  fail(ErrorKind::kInternal, "an optimizer kind without a descriptor");
}

void narrow_block(std::span<const float> in, ckpt::DType narrow, uint16_t* out) {
  const std::span<uint16_t> bits(out, in.size());
  if (narrow == ckpt::DType::kBF16) ckpt::convert_fp32_to_bf16(in, bits);
  if (narrow == ckpt::DType::kF16) ckpt::convert_fp32_to_fp16(in, bits);
}

void narrow_weights(std::span<const float> in, ckpt::DType narrow, uint16_t* out) {
  const int64_t n = static_cast<int64_t>(in.size());
#pragma omp parallel for schedule(static)
  for (int64_t lo = 0; lo < n; lo += kUpdateBlock) {
    narrow_block(in.subspan(static_cast<size_t>(lo), static_cast<size_t>(std::min(kUpdateBlock, n - lo))), narrow,
                 out + lo);
  }
}

}  // namespace shardkit::trainer
