#include "trainer/cuda/cuda_common.hpp"

namespace shardkit::trainer::cuda {

void throw_cuda(const char* what, const char* detail, const char* file, int line) {
  fail(ErrorKind::kInternal, std::string(what) + " failed at " + file + ":" + std::to_string(line) + ": " + detail);
}

}  // namespace shardkit::trainer::cuda
