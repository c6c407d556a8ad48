// make_cuda_backend and make_cuda_scorer in builds without CUDA: a clear error instead of a missing
// feature.
#include "base/error.hpp"
#include "trainer/backend.hpp"
#include "trainer/eval.hpp"

namespace shardkit::trainer {

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions&) {
  fail(ErrorKind::kInvalidInput,
       "--device cuda: this shardkit was built without CUDA (configure on a machine with nvcc and NCCL)");
}

std::unique_ptr<WindowScorer> make_cuda_scorer(const model::Model&, const InitFn&, int, int, ckpt::DType,
                                               comm::MpiCollective&) {
  fail(ErrorKind::kInvalidInput,
       "--device cuda: this shardkit was built without CUDA (configure on a machine with nvcc and NCCL)");
}

}  // namespace shardkit::trainer
