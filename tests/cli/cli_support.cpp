#include "tests/cli/cli_support.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace shardkit::testing::cli {

const std::string& samples() {
  static const std::string dir = std::string(SHARDKIT_SOURCE_DIR) + "/samples/configs/";
  return dir;
}

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

int count_lines(const std::string& s) {
  return static_cast<int>(std::count(s.begin(), s.end(), '\n'));
}

Result run(const std::string& args, const std::string& prefix, const std::string& env) {
  static TempDir scratch;
  const std::string command = std::string(SHARDKIT_TEST_ENV) + " " + env + " " + prefix + " " + SHARDKIT_BINARY + " " +
                              args + " >" + (scratch / "out").string() + " 2>" + (scratch / "err").string();
  const int status = std::system(command.c_str());
  Result r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(scratch / "out");
  r.err = slurp(scratch / "err");
  return r;
}

std::string mpirun(int ranks) {
  return std::string(SHARDKIT_MPIEXEC) + " -n " + std::to_string(ranks) + " --oversubscribe";
}

std::filesystem::path write_text_tokens(const TempDir& dir) {
  std::ofstream text(dir / "text.txt");
  for (int i = 0; i < 200; ++i) text << "sharded checkpoints let a run resume on any number of ranks " << i << ". ";
  text.close();
  const Result r = run("data encode " + (dir / "text.txt").string() + " -o " + (dir / "text.bin").string());
  EXPECT_EQ(r.code, 0) << r.err;
  return dir / "text.bin";
}

std::vector<nlohmann::json> read_metrics(const std::filesystem::path& file, bool events) {
  std::vector<nlohmann::json> out;
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("event") == events) out.push_back(std::move(j));
  }
  return out;
}

}  // namespace shardkit::testing::cli
