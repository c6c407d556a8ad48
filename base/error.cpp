#include "base/error.hpp"

#include <cstring>
#include <string>

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

// The kind's number, a space, the message.
std::string error_to_text(const std::exception& e) {
  const auto* error = dynamic_cast<const Error*>(&e);
  const ErrorKind kind = error ? error->kind() : ErrorKind::kInternal;
  return std::to_string(static_cast<int>(kind)) + " " + e.what();
}

void throw_if_error_text(const std::string& text) {
  if (text.empty()) return;
  const char digit = text[0];
  if (text.size() < 2 || digit < '0' || digit > static_cast<char>('0' + static_cast<int>(ErrorKind::kInternal)) ||
      text[1] != ' ') {
    fail(ErrorKind::kInternal, "an error from another rank, garbled: " + text);
  }
  fail(static_cast<ErrorKind>(digit - '0'), text.substr(2));
}

}  // namespace shardkit
