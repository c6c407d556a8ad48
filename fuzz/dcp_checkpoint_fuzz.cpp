// A PyTorch DCP checkpoint folder made of arbitrary bytes, read as `convert import-dcp`, `reshard` and
// `consolidate` read one without a model: the .metadata pickle run with DCP's list of globals, its
// chunks and storage locations checked, every item's torch.save archive opened inside its .distcp file,
// the key layout, tied names, steps and parameter groups found, and a few values of every tensor's
// states read through the chunks. Every input must give a result or an Error, never a crash, hang,
// leak, out-of-bounds access, overflow or an allocation beyond the bounds.
//
// Input: records of a role byte, a 4-byte little-endian length and that many bytes: role 0 is
// `.metadata`, role 1 + r the file `__r_0.distcp` (r < 4). The seeds are checkpoints real PyTorch wrote
// (tests/data/dcp/net-w2 and gpt2-w2), packed this way at start-up into the folder named by
// SHARDKIT_FUZZ_SEEDS (scripts/fuzz.sh passes the corpus folder).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>

#include "base/error.hpp"
#include "convert/dcp/dcp_checkpoint.hpp"
#include "fuzz/folder_input.hpp"
#include "fuzz/scratch.hpp"

namespace {

using shardkit::convert::dcp::DcpCheckpoint;
using shardkit::fuzz::append_record;
using shardkit::fuzz::read_file;
using shardkit::fuzz::write_file;

constexpr int kMaxRanks = 4;

const std::filesystem::path& scratch() {
  static const shardkit::fuzz::Scratch s("dcp");
  return s.path();
}

std::string file_name(int rank) {
  return "__" + std::to_string(rank) + "_0.distcp";
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* seeds = std::getenv("SHARDKIT_FUZZ_SEEDS");
  const std::filesystem::path data = std::filesystem::path(SHARDKIT_TEST_DATA_DIR) / "dcp";
  std::error_code ec;
  if (!seeds || !std::filesystem::is_directory(data, ec)) return 0;
  for (const char* name : {"net-w2", "gpt2-w2"}) {
    const std::filesystem::path dir = data / name / "dcp";
    if (!std::filesystem::is_regular_file(dir / ".metadata", ec)) continue;
    std::string packed;
    append_record(packed, 0, read_file(dir / ".metadata"));
    for (int r = 0; r < kMaxRanks && std::filesystem::is_regular_file(dir / file_name(r), ec); ++r) {
      append_record(packed, 1 + r, read_file(dir / file_name(r)));
    }
    write_file(std::filesystem::path(seeds) / ("dcp_" + std::string(name)), packed);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::filesystem::path dir = scratch() / "dcp";
  std::filesystem::remove_all(scratch());
  std::filesystem::create_directories(dir);
  shardkit::fuzz::for_each_record(data, size, 0, [&](int role, std::string_view bytes) {
    if (role == 0) {
      write_file(dir / ".metadata", bytes);
    } else if (role <= kMaxRanks) {
      write_file(dir / file_name(role - 1), bytes);
    }
  });
  try {
    const DcpCheckpoint ckpt(dir, nullptr);
    shardkit::fuzz::read_a_few(ckpt, 3);
  } catch (const shardkit::Error&) {
  }
  return 0;
}
