// Errors of the shardkit libraries: an exception that carries a category and a message with context
// (file, tensor, rank, expected vs found). Library code throws; only the CLI maps a category to an
// exit code and prints the message as one line.
#pragma once

#include <stdexcept>
#include <string>

namespace shardkit {

enum class ErrorKind {
  kInvalidInput,  // the user's input is wrong: missing path, bad option, not a checkpoint (exit 2)
  kCorrupt,       // a checkpoint or file fails its checks: checksum, size, inconsistent metadata (exit 1)
  kIo,            // the operating system refused: ENOSPC, EIO, permission (exit 1)
  kInternal,      // a bug or an unexpected library failure (exit 1)
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const noexcept { return kind_; }

 private:
  ErrorKind kind_;
};

// Exit code of the command line for an error of this kind: 2 for bad input, 1 otherwise.
int exit_code_for(ErrorKind kind) noexcept;

// Throws Error(kind, message).
[[noreturn]] void fail(ErrorKind kind, const std::string& message);

// Throws Error(kIo, "<what>: <strerror(errnum)>").
[[noreturn]] void fail_errno(const std::string& what, int errnum);

// An error caught on one rank and passed to the others as text (a broadcast), its kind kept: the
// text is "" for no error. An exception that is not an Error counts as kInternal.
std::string error_to_text(const std::exception& e);
// Throws the Error that error_to_text described; returns for "".
void throw_if_error_text(const std::string& text);

}  // namespace shardkit
