// Strings from untrusted inputs (a step directory's name, a manifest's fields, a tensor name) printed
// by verify, inspect and the error line: none may reach the terminal raw, or a crafted checkpoint could
// clear the line and draw a green "OK" under a failing verify. Each output is checked byte by byte.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "base/xxh64.hpp"
#include "ckpt/manifest.hpp"
#include "ckpt/shard_format.hpp"
#include "tests/cli/cli_support.hpp"

namespace shardkit {
namespace {

using namespace testing::cli;

// Clears the line, returns to its start, draws a green OK, sets the window title, starts a new line.
const std::string kPayload =
    "x\033[2K\r\033[32mOK\033[0m\033]0;pwned\007\n\xc2\x9b"
    "31m";

// The bytes of `text` that a terminal acts on: every C0 control but the line ends the command itself
// wrote, DEL, and C1 controls (raw or UTF-8 encoded).
std::string control_bytes(const std::string& text) {
  std::string found;
  for (size_t i = 0; i < text.size(); ++i) {
    const auto b = static_cast<unsigned char>(text[i]);
    const bool c1 = b == 0xc2 && i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
                    static_cast<unsigned char>(text[i + 1]) <= 0x9f;
    if ((b < 0x20 && b != '\n') || b == 0x7f || (b >= 0x80 && b <= 0x9f) || c1) found += std::to_string(b) + " ";
  }
  return found;
}

// `path` quoted for the shell (single quotes keep ESC and newlines as they are).
std::string shell_quoted(const std::filesystem::path& path) {
  std::string out = "'";
  for (const char c : path.string()) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// A committed checkpoint of 2 ranks in `dir`/run; returns its step directory.
std::filesystem::path checkpoint(const testing::TempDir& dir) {
  const ckpt::TensorTable table{{{"emb", {64, 16}, ckpt::DType::kF32}, {"bias", {16}, ckpt::DType::kF32}}};
  ckpt::ShardOptions options;
  options.chunk_elems = 128;
  return testing::write_synthetic_checkpoint(dir / "run", table, {2, 1, 16}, options, 1);
}

// Writes `manifest` as a forger would: any content, with the digest recomputed.
void write_sealed(const std::filesystem::path& step_dir, nlohmann::json manifest) {
  manifest.erase("manifest_digest");
  const std::string canonical = manifest.dump();
  manifest["manifest_digest"] = to_hex(xxh64(canonical.data(), canonical.size()));
  std::ofstream(step_dir / "manifest.json", std::ios::trunc) << manifest.dump(2);
}

TEST(ControlChars, AFailingVerifyOfACheckpointWithEscapesInItsNameDrawsNoFakeOk) {
  testing::TempDir dir;
  const std::filesystem::path step = checkpoint(dir);
  const std::filesystem::path named = dir / ("run" + kPayload);
  std::filesystem::rename(dir / "run", named);
  const std::filesystem::path shard = named / step.filename() / ckpt::shard_file_name(1, 2);
  testing::flip_bit(shard, testing::chunk_extent(shard, "fp32", 0).offset + 8, 2);
  const Result r = run("ckpt verify -q " + shell_quoted(named / step.filename()));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(control_bytes(r.out + r.err), "") << r.out << r.err;
  EXPECT_NE(r.err.find("\\x1b[32mOK"), std::string::npos) << "the name is shown, escaped: " << r.err;
  EXPECT_NE(r.err.find("FAILED verification"), std::string::npos) << r.err;
}

TEST(ControlChars, InspectShowsManifestStringsEscaped) {
  testing::TempDir dir;
  const std::filesystem::path step = checkpoint(dir);
  nlohmann::json manifest = ckpt::manifest_to_json(ckpt::read_manifest(step));
  manifest["writer"] = "shardkit" + kPayload;
  manifest["created"] = kPayload;
  manifest["trainer_state"] = {{"note", kPayload + "\x7f"}};
  write_sealed(step, manifest);
  const Result r = run("ckpt inspect " + shell_quoted(step));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(control_bytes(r.out + r.err), "") << r.out;
  EXPECT_NE(r.out.find("written by shardkitx\\x1b[2K\\x0d\\x1b[32mOK"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\\xc2\\x9b31m"), std::string::npos) << "a C1 control, UTF-8 encoded: " << r.out;

  const Result json = run("ckpt inspect --json " + shell_quoted(step));
  ASSERT_EQ(json.code, 0) << json.err;
  EXPECT_EQ(control_bytes(json.out), "") << json.out;
  EXPECT_EQ(nlohmann::json::parse(json.out)["writer"], "shardkit" + kPayload) << "--json keeps the value exactly";
}

TEST(ControlChars, TheErrorLineQuotingAForgedTensorNameIsOneEscapedLine) {
  testing::TempDir dir;
  const std::filesystem::path step = checkpoint(dir);
  nlohmann::json manifest = ckpt::manifest_to_json(ckpt::read_manifest(step));
  manifest["tensors"][0]["name"] = kPayload;
  write_sealed(step, manifest);
  for (const char* command : {"ckpt inspect ", "ckpt verify -q "}) {
    SCOPED_TRACE(command);
    const Result r = run(std::string(command) + shell_quoted(step));
    EXPECT_NE(r.code, 0);
    EXPECT_EQ(control_bytes(r.out + r.err), "") << r.err;
    EXPECT_EQ(count_lines(r.err), 1) << r.err;
    EXPECT_EQ(r.err.rfind("shardkit: error: ", 0), 0u) << r.err;
  }
  // An option CLI11 refuses is quoted in its error line too.
  const Result r = run("ckpt verify " + shell_quoted(step) + " " + shell_quoted("--x" + kPayload));
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(control_bytes(r.out + r.err), "") << r.err;
}

}  // namespace
}  // namespace shardkit
