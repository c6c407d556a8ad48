// A fuzzer's scratch path: a name of this process's own under the temporary directory, removed with
// everything under it when the process exits (libFuzzer ends a bounded run through exit(), which runs
// the destructors of function-local statics), so that runs leave nothing behind.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

namespace shardkit::fuzz {

class Scratch {
 public:
  // shardkit-fuzz-<name>-<pid><suffix>
  explicit Scratch(std::string_view name, std::string_view suffix = "")
      : path_(std::filesystem::temp_directory_path() /
              ("shardkit-fuzz-" + std::string(name) + "-" + std::to_string(::getpid()) + std::string(suffix))) {}
  ~Scratch() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  const std::filesystem::path& path() const noexcept { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace shardkit::fuzz
