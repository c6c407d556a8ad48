#include "ckpt/error.hpp"

#include <cstring>

namespace shardkit {

int exit_code_for(ErrorKind kind) noexcept {
  return kind == ErrorKind::kInvalidInput ? 2 : 1;
}

void fail(ErrorKind kind, const std::string& message) {
  throw Error(kind, message);
}

void fail_errno(const std::string& what, int errnum) {
  fail(ErrorKind::kIo, what + ": " + std::strerror(errnum));
}

}  // namespace shardkit
