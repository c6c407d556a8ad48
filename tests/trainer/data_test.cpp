#include "trainer/data.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "ckpt/error.hpp"

namespace shardkit::trainer {
namespace {

// A fresh directory under the system temp dir, removed with its files on destruction.
class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "shardkit_data_test_XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + pattern);
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

void write_bytes(const std::filesystem::path& path, const void* data, size_t size) {
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

void write_raw(const std::filesystem::path& path, const std::vector<uint16_t>& tokens) {
  write_bytes(path, tokens.data(), tokens.size() * sizeof(uint16_t));
}

// An llm.c data shard: 256 int32 header (magic, version, count) and the tokens.
void write_llmc(const std::filesystem::path& path, const std::vector<uint16_t>& tokens, int32_t version = 1,
                int32_t declared_count = -1) {
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520;
  header[1] = version;
  header[2] = declared_count >= 0 ? declared_count : static_cast<int32_t>(tokens.size());
  std::vector<char> bytes(header.size() * sizeof(int32_t) + tokens.size() * sizeof(uint16_t));
  std::memcpy(bytes.data(), header.data(), header.size() * sizeof(int32_t));
  std::copy_n(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(uint16_t),
              bytes.data() + header.size() * sizeof(int32_t));  // copy_n: tokens may be empty
  write_bytes(path, bytes.data(), bytes.size());
}

// Tokens 0, 1, 2, ... wrapped below `modulus`, so a token's value tells its position.
std::vector<uint16_t> counting_tokens(int64_t count, int modulus = 65536) {
  std::vector<uint16_t> tokens(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) tokens[static_cast<size_t>(i)] = static_cast<uint16_t>(i % modulus);
  return tokens;
}

// Runs `action`, expecting Error(kInvalidInput) whose message names `path` and contains `detail`.
template <typename Action>
void expect_invalid_input(Action action, const std::filesystem::path& path, const std::string& detail) {
  try {
    action();
    ADD_FAILURE() << "no error for " << path << " (expected \"" << detail << "\")";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput) << e.what();
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(detail), std::string::npos) << e.what();
  }
}

// The samples at global indices [first, first + count).
std::vector<int64_t> samples(SampleOrder& order, int64_t first, int64_t count) {
  std::vector<int64_t> out;
  for (int64_t g = first; g < first + count; ++g) out.push_back(order.sample_at(g));
  return out;
}

// ---- Philox --------------------------------------------------------------------------------------

struct KnownAnswer {
  uint32_t counter[4];
  uint32_t key[2];
  uint32_t expected[4];
};

// Random123's kat_vectors, philox4x32_10.
TEST(Philox, MatchesRandom123KnownAnswers) {
  const KnownAnswer cases[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const KnownAnswer& c : cases) {
    const uint64_t key = (uint64_t{c.key[1]} << 32) | c.key[0];
    const uint64_t counter_lo = (uint64_t{c.counter[1]} << 32) | c.counter[0];
    const uint64_t counter_hi = (uint64_t{c.counter[3]} << 32) | c.counter[2];
    uint32_t out[4];
    Philox::generate(key, counter_lo, counter_hi, out);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(out[i], c.expected[i]) << "word " << i << " for key " << std::hex << key;
  }
}

TEST(Philox, UniformLiesInUnitIntervalWithMeanOneHalf) {
  constexpr int kDraws = 100000;
  double sum = 0, sum_sq = 0;
  for (int i = 0; i < kDraws; ++i) {
    const double u = Philox::uniform(42, static_cast<uint64_t>(i), 7);
    ASSERT_GE(u, 0.0) << "draw " << i;
    ASSERT_LT(u, 1.0) << "draw " << i;
    sum += u;
    sum_sq += u * u;
  }
  const double mean = sum / kDraws;
  EXPECT_NEAR(mean, 0.5, 0.01);                                 // standard error ~0.001
  EXPECT_NEAR(sum_sq / kDraws - mean * mean, 1.0 / 12, 0.005);  // variance of U(0, 1)
  EXPECT_EQ(Philox::uniform(42, 3, 7), Philox::uniform(42, 3, 7));
  EXPECT_NE(Philox::uniform(42, 3, 7), Philox::uniform(43, 3, 7));
}

TEST(Philox, NormalHasZeroMeanAndUnitVariance) {
  constexpr int kDraws = 100000;
  double sum = 0, sum_sq = 0;
  for (int i = 0; i < kDraws; ++i) {
    const double z = Philox::normal(1234, static_cast<uint64_t>(i), 0);
    ASSERT_TRUE(std::isfinite(z)) << "draw " << i;
    sum += z;
    sum_sq += z * z;
  }
  const double mean = sum / kDraws;
  EXPECT_NEAR(mean, 0.0, 0.02);  // standard error ~0.003
  EXPECT_NEAR(sum_sq / kDraws - mean * mean, 1.0, 0.03);
  EXPECT_EQ(Philox::normal(1234, 5, 0), Philox::normal(1234, 5, 0));
}

// ---- TokenFile -----------------------------------------------------------------------------------

TEST(TokenFile, RawAndLlmcFilesGiveTheSameTokens) {
  ScratchDir dir;
  const std::vector<uint16_t> tokens = counting_tokens(1000, 50257);  // 2000 bytes: longer than a header
  write_raw(dir / "train.bin", tokens);
  write_llmc(dir / "shard.bin", tokens);

  const TokenFile raw(dir / "train.bin");
  const TokenFile llmc(dir / "shard.bin");
  EXPECT_FALSE(raw.llmc_format());
  EXPECT_TRUE(llmc.llmc_format());
  ASSERT_EQ(raw.size(), 1000);
  ASSERT_EQ(llmc.size(), 1000);
  EXPECT_EQ(std::vector<uint16_t>(raw.tokens(), raw.tokens() + raw.size()), tokens);
  EXPECT_EQ(std::vector<uint16_t>(llmc.tokens(), llmc.tokens() + llmc.size()), tokens);
  EXPECT_EQ(raw.path(), dir / "train.bin");
}

TEST(TokenFile, LlmcHeaderCountWinsOverTrailingBytes) {
  ScratchDir dir;
  write_llmc(dir / "shard.bin", counting_tokens(100), 1, 60);
  const TokenFile file(dir / "shard.bin");
  EXPECT_TRUE(file.llmc_format());
  EXPECT_EQ(file.size(), 60);
  EXPECT_EQ(file.tokens()[59], 59);
}

TEST(TokenFile, ShortFileStartingWithTheMagicIsRaw) {
  ScratchDir dir;
  const int32_t magic = 20240520;
  std::vector<uint16_t> tokens(10, 0);
  std::memcpy(tokens.data(), &magic, sizeof(magic));  // 20 bytes: too short for an llm.c header
  write_raw(dir / "short.bin", tokens);
  const TokenFile file(dir / "short.bin");
  EXPECT_FALSE(file.llmc_format());
  EXPECT_EQ(file.size(), 10);
}

TEST(TokenFile, RejectsMalformedFilesNamingThem) {
  ScratchDir dir;
  const std::vector<uint16_t> tokens = counting_tokens(50);

  const auto odd = dir / "odd.bin";
  write_bytes(odd, "abc", 3);
  expect_invalid_input([&] { TokenFile f(odd); }, odd, "odd size of 3 bytes");

  const auto empty = dir / "empty.bin";
  write_bytes(empty, "", 0);
  expect_invalid_input([&] { TokenFile f(empty); }, empty, "holds no tokens");

  const auto no_tokens = dir / "no_tokens.bin";
  write_llmc(no_tokens, {});
  expect_invalid_input([&] { TokenFile f(no_tokens); }, no_tokens, "holds no tokens");

  const auto version = dir / "version.bin";
  write_llmc(version, tokens, 2);
  expect_invalid_input([&] { TokenFile f(version); }, version, "version 2, expected 1");

  const auto too_many = dir / "too_many.bin";
  write_llmc(too_many, tokens, 1, 51);
  expect_invalid_input([&] { TokenFile f(too_many); }, too_many, "declares 51 tokens (1126 bytes");

  const auto missing = dir / "missing.bin";
  expect_invalid_input([&] { TokenFile f(missing); }, missing, "no such file");
}

// ---- SampleOrder ---------------------------------------------------------------------------------

TEST(SampleOrder, CountsNonOverlappingWindows) {
  ScratchDir dir;
  write_raw(dir / "a.bin", counting_tokens(100));
  write_raw(dir / "b.bin", counting_tokens(9));
  const TokenFile a(dir / "a.bin");
  const TokenFile b(dir / "b.bin");
  EXPECT_EQ(SampleOrder(a, 8, 0).num_samples(), 12);  // (100 - 1) / 8
  EXPECT_EQ(SampleOrder(a, 99, 0).num_samples(), 1);
  EXPECT_EQ(SampleOrder(b, 8, 0).num_samples(), 1);  // exactly seq_len + 1 tokens
}

TEST(SampleOrder, RejectsFileTooShortForOneWindow) {
  ScratchDir dir;
  const auto path = dir / "tiny.bin";
  write_raw(path, counting_tokens(8));
  const TokenFile file(path);
  expect_invalid_input([&] { SampleOrder order(file, 8, 0); }, path, "8 tokens, fewer than the seq_len + 1 = 9");
  expect_invalid_input([&] { SampleOrder order(file, 0, 0); }, path, "sequence length 0 must be positive");
}

TEST(SampleOrder, RejectsNegativeGlobalIndex) {
  ScratchDir dir;
  write_raw(dir / "t.bin", counting_tokens(100));
  const TokenFile file(dir / "t.bin");
  SampleOrder order(file, 8, 0);
  try {
    order.sample_at(-1);
    ADD_FAILURE() << "no error for a negative index";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInternal) << e.what();
  }
}

TEST(SampleOrder, EveryEpochIsAPermutation) {
  ScratchDir dir;
  write_raw(dir / "t.bin", counting_tokens(1000));
  const TokenFile file(dir / "t.bin");
  SampleOrder order(file, 7, 99);
  const int64_t s = order.num_samples();  // 142
  std::vector<int64_t> all(static_cast<size_t>(s));
  std::iota(all.begin(), all.end(), int64_t{0});
  for (int64_t epoch = 0; epoch < 5; ++epoch) {
    std::vector<int64_t> seen = samples(order, epoch * s, s);
    std::sort(seen.begin(), seen.end());
    EXPECT_EQ(seen, all) << "epoch " << epoch;
  }
}

TEST(SampleOrder, OrderDiffersBetweenEpochsAndSeeds) {
  ScratchDir dir;
  write_raw(dir / "t.bin", counting_tokens(1000));
  const TokenFile file(dir / "t.bin");
  SampleOrder a(file, 7, 1);
  SampleOrder b(file, 7, 2);
  const int64_t s = a.num_samples();
  std::vector<int64_t> identity(static_cast<size_t>(s));
  std::iota(identity.begin(), identity.end(), int64_t{0});
  const std::vector<int64_t> a0 = samples(a, 0, s);
  EXPECT_NE(a0, identity);
  EXPECT_NE(a0, samples(a, s, s));
  EXPECT_NE(samples(a, s, s), samples(a, 2 * s, s));
  EXPECT_NE(a0, samples(b, 0, s));
}

TEST(SampleOrder, SameSeedGivesTheSameOrderWhateverTheQueryOrder) {
  ScratchDir dir;
  write_raw(dir / "t.bin", counting_tokens(1000));
  const TokenFile file(dir / "t.bin");
  SampleOrder ascending(file, 5, 2024);
  SampleOrder scattered(file, 5, 2024);
  const int64_t total = 4 * ascending.num_samples();
  const std::vector<int64_t> expected = samples(ascending, 0, total);

  std::vector<int64_t> queries(static_cast<size_t>(total));
  std::iota(queries.begin(), queries.end(), int64_t{0});
  std::shuffle(queries.begin(), queries.end(), std::mt19937(5));  // jumps between epochs on most queries
  for (int64_t g : queries) ASSERT_EQ(scattered.sample_at(g), expected[static_cast<size_t>(g)]) << "g = " << g;
}

TEST(SampleOrder, FillCopiesTheWindowOfTheSample) {
  ScratchDir dir;
  constexpr int kSeqLen = 16;
  write_llmc(dir / "t.bin", counting_tokens(1000));
  const TokenFile file(dir / "t.bin");
  SampleOrder order(file, kSeqLen, 3);
  std::vector<int32_t> inputs(kSeqLen), targets(kSeqLen);
  for (int64_t g = 0; g < 2 * order.num_samples(); ++g) {
    order.fill(g, 50257, inputs.data(), targets.data());
    const int64_t start = order.sample_at(g) * kSeqLen;
    for (int t = 0; t < kSeqLen; ++t) {
      ASSERT_EQ(inputs[static_cast<size_t>(t)], start + t) << "g = " << g << ", t = " << t;
      ASSERT_EQ(targets[static_cast<size_t>(t)], start + t + 1) << "g = " << g << ", t = " << t;
    }
  }
}

// The global index of the first epoch that holds `sample`.
int64_t index_of(SampleOrder& order, int64_t sample) {
  for (int64_t g = 0; g < order.num_samples(); ++g)
    if (order.sample_at(g) == sample) return g;
  return -1;
}

TEST(SampleOrder, FillRejectsTokensOutsideTheVocabulary) {
  ScratchDir dir;
  constexpr int kSeqLen = 8;
  const auto path = dir / "t.bin";
  std::vector<uint16_t> tokens = counting_tokens(200, 100);
  tokens[37] = 300;  // an input of sample 4 (tokens 32..40)
  tokens[48] = 100;  // the last target of sample 5 (tokens 40..48), equal to the vocabulary size
  write_raw(path, tokens);
  const TokenFile file(path);
  SampleOrder order(file, kSeqLen, 11);
  std::vector<int32_t> inputs(kSeqLen), targets(kSeqLen);

  const int64_t g37 = index_of(order, 4);
  const int64_t g48 = index_of(order, 5);
  ASSERT_GE(g37, 0);
  ASSERT_GE(g48, 0);
  expect_invalid_input([&] { order.fill(g37, 100, inputs.data(), targets.data()); }, path,
                       "token id 300 at position 37 is outside the vocabulary of 100 tokens");
  expect_invalid_input([&] { order.fill(g48, 100, inputs.data(), targets.data()); }, path,
                       "token id 100 at position 48 is outside the vocabulary of 100 tokens");
  EXPECT_NO_THROW(order.fill(g48, 301, inputs.data(), targets.data()));
}

}  // namespace
}  // namespace shardkit::trainer
