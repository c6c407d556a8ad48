// How a model reaches its parameters and gradients without knowing ZeRO. A model works group by
// group (its family decides the groups, e.g. the embeddings, each transformer block, the final
// norm): it acquires a group's parameters before using them and releases them after; it opens a
// group's gradient buffers, adds its contributions into them, and closes them when the group's
// gradients of the micro-batch are complete. The ZeRO engine decides what that means: views into a
// replicated buffer (stages 0-2), an all-gather of partitions (stage 3), gradients accumulated in
// place (stages 0-1) or reduce-scattered into their owners' partitions (stages 2-3).
#pragma once

namespace shardkit::model {

// A group: the tensors [first, last) of the tensor table (contiguous in table order).
struct TensorGroup {
  int first = 0;
  int last = 0;
};

// P is the type the model reads parameters in: float on CPU ranks; on GPUs the compute type (device
// pointers, and a GPU store adds a way to wait for its stream: model/cuda/gpu_model.hpp). Gradients
// are fp32 everywhere.
template <typename P>
class BasicParameterStore {
 public:
  virtual ~BasicParameterStore() = default;

  // The full values of the group's tensors are readable through param() until release(group).
  virtual void acquire(int group) = 0;
  virtual void release(int group) = 0;
  virtual const P* param(int tensor) const = 0;

  // Gradient buffers of the group's tensors, for += accumulation, between open_grads and close_grads
  // (on a GPU, stored instead where the buffers hold nothing of the step: GpuParamStore::grads_fresh).
  virtual void open_grads(int group) = 0;
  virtual float* grad(int tensor) = 0;
  virtual void close_grads(int group) = 0;
};

using ParameterStore = BasicParameterStore<float>;

}  // namespace shardkit::model
