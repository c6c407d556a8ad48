// A DeepSpeed checkpoint folder made of arbitrary bytes, read as `convert import-deepspeed` and
// `reshard` read one without a model: the files' pickles are run, their parameter groups, sub-groups,
// ranks and tensor views mapped onto the table param_shapes names, and a few values of every tensor's
// three states read through that mapping. Every input must give a result or an Error, never a crash,
// hang, leak, out-of-bounds access, overflow or an allocation beyond the bounds.
//
// Input: one flags byte (bit 0: stage 3's file names, a model-states file per rank; bit 1: the bf16_
// prefix of the optimizer files), then records of a role byte, a 4-byte little-endian length and that
// many bytes: role 0 is the model states, role 1 + r rank r's optimizer states (r < 8). The seeds are
// checkpoints real DeepSpeed wrote (tests/data/deepspeed/net-*, the smallest), packed this way at
// start-up into the folder named by SHARDKIT_FUZZ_SEEDS (scripts/fuzz.sh passes the corpus folder).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <string>
#include <string_view>

#include "base/error.hpp"
#include "convert/deepspeed/ds_checkpoint.hpp"
#include "fuzz/folder_input.hpp"
#include "fuzz/scratch.hpp"

namespace {

using shardkit::fuzz::append_record;
using shardkit::fuzz::read_file;
using shardkit::fuzz::write_file;

using namespace shardkit::convert::deepspeed;

constexpr int kMaxRanks = 8;

const std::filesystem::path& scratch() {
  static const shardkit::fuzz::Scratch s("ds");
  return s.path();
}

// A real checkpoint's tag folder packed as a fuzz input.
void write_seed(const std::filesystem::path& tag_dir, const std::filesystem::path& to) {
  static const std::regex kOptim(R"((bf16_)?zero_pp_rank_(\d+)_mp_rank_00_optim_states\.pt)");
  std::string packed(1, '\0');
  for (const auto& entry : std::filesystem::directory_iterator(tag_dir)) {
    const std::string name = entry.path().filename().string();
    std::smatch m;
    if (std::regex_match(name, m, kOptim)) {
      const int rank = std::stoi(m[2].str());
      if (rank >= kMaxRanks) return;
      if (m[1].matched) packed[0] = static_cast<char>(packed[0] | 2);
      append_record(packed, 1 + rank, read_file(entry.path()));
    } else if (name == "zero_pp_rank_0_mp_rank_00_model_states.pt" || name == "mp_rank_00_model_states.pt") {
      if (name.starts_with("zero_pp")) packed[0] = static_cast<char>(packed[0] | 1);
      append_record(packed, 0, read_file(entry.path()));
    }
  }
  write_file(to, packed);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* seeds = std::getenv("SHARDKIT_FUZZ_SEEDS");
  const std::filesystem::path data = std::filesystem::path(SHARDKIT_TEST_DATA_DIR) / "deepspeed";
  std::error_code ec;
  if (!seeds || !std::filesystem::is_directory(data, ec)) return 0;
  for (const auto& entry : std::filesystem::directory_iterator(data)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with("net-") || !std::filesystem::is_regular_file(entry.path() / "latest", ec)) continue;
    const std::string tag = read_file(entry.path() / "latest");
    write_seed(entry.path() / tag, std::filesystem::path(seeds) / ("ds_" + name));
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::filesystem::path dir = scratch() / "global_step1";
  std::filesystem::remove_all(scratch());
  std::filesystem::create_directories(dir);
  const bool stage3_names = data[0] & 1;
  const std::string prefix = data[0] & 2 ? "bf16_" : "";
  shardkit::fuzz::for_each_record(data, size, 1, [&](int role, std::string_view bytes) {
    if (role == 0) {
      write_file(dir / (stage3_names ? "zero_pp_rank_0_mp_rank_00_model_states.pt" : "mp_rank_00_model_states.pt"),
                 bytes);
    } else if (role <= kMaxRanks) {
      write_file(dir / (prefix + "zero_pp_rank_" + std::to_string(role - 1) + "_mp_rank_00_optim_states.pt"), bytes);
    }
  });
  try {
    const DeepSpeedCheckpoint ckpt(dir, nullptr);
    shardkit::fuzz::read_a_few(ckpt, 1 + static_cast<int>(ckpt.moments().size()));
  } catch (const shardkit::Error&) {
  }
  return 0;
}
