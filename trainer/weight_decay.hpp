// Weight decay by parameter group: the model says which tensors decay (Model::decays: matrices and
// embeddings, not biases or normalisation weights); here that becomes the ranges of an optimizer view
// the update leaves undecayed. A rank's view spans many tensors -- and its ends cut through some -- so
// the table is built from the fragments the layout places in the view, once per run, and every
// implementation of the update (CPU engine, GPU kernel, CPU offload) reads the same table.
#pragma once

#include <span>
#include <vector>

#include "ckpt/layout.hpp"
#include "model/model.hpp"
#include "trainer/adamw.hpp"

namespace shardkit::trainer {

// Per tensor of the model's table: whether weight decay applies to it.
std::vector<bool> decay_flags(const model::Model& model);

// The positions of an optimizer view that hold tensors without decay: `plan` places pieces of tensors
// in the view (tensor, offset, length, position), `decays` is per tensor. Sorted and disjoint; ranges
// separated by nothing but padding (which no update moves from zero) are merged. Error(kInternal)
// when a fragment names a tensor `decays` lacks.
std::vector<ElementRange> no_decay_ranges(std::span<const ckpt::Fragment> plan, const std::vector<bool>& decays);

}  // namespace shardkit::trainer
