// Running the shardkit binary from tests as a user would: a shell command line in the test
// environment (OpenMPI as root, sanitizer options), its exit code and output.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/support/test_support.hpp"

namespace shardkit::testing::cli {

struct Result {
  int code = -1;
  std::string out;
  std::string err;
};

// The sample configs of the repository.
const std::string& samples();

std::string slurp(const std::filesystem::path& p);
int count_lines(const std::string& s);

// Runs `shardkit ARGS`; `prefix` goes before the binary (e.g. mpirun(2)), `env` (VAR=value ...) before both.
Result run(const std::string& args, const std::string& prefix = "", const std::string& env = "");
std::string mpirun(int ranks);

// Byte-level tokens of a repeated sentence in `dir`/text.bin: enough windows of 65 tokens for gpt2-tiny.
std::filesystem::path write_text_tokens(const TempDir& dir);

// The per-step records of a metrics file (`events`: the other records, e.g. checkpoints, instead).
std::vector<nlohmann::json> read_metrics(const std::filesystem::path& file, bool events = false);

}  // namespace shardkit::testing::cli
