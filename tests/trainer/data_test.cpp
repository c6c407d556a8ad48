#include "trainer/data.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "base/error.hpp"

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

// An llm.c data shard: 256 int32 header (magic, version, count) and the tokens, uint16 (GPT-2,
// magic 20240520) or uint32 (Llama 3, magic 20240801).
template <typename Id>
void write_llmc_with(const std::filesystem::path& path, int32_t magic, const std::vector<Id>& tokens, int32_t version,
                     std::optional<int32_t> declared_count) {
  std::vector<int32_t> header(256, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = declared_count.value_or(static_cast<int32_t>(tokens.size()));
  std::vector<char> bytes(header.size() * sizeof(int32_t) + tokens.size() * sizeof(Id));
  std::memcpy(bytes.data(), header.data(), header.size() * sizeof(int32_t));
  std::copy_n(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(Id),
              bytes.data() + header.size() * sizeof(int32_t));  // copy_n: tokens may be empty
  write_bytes(path, bytes.data(), bytes.size());
}

void write_llmc(const std::filesystem::path& path, const std::vector<uint16_t>& tokens, int32_t version = 1,
                std::optional<int32_t> declared_count = {}) {
  write_llmc_with(path, 20240520, tokens, version, declared_count);
}

void write_llmc_llama3(const std::filesystem::path& path, const std::vector<uint32_t>& tokens, int32_t version = 7,
                       std::optional<int32_t> declared_count = {}) {
  write_llmc_with(path, 20240801, tokens, version, declared_count);
}

// The bytes of a .npy file as NumPy lays it out: magic, format version, header length (uint16 for
// 1.0, uint32 for 2.0 and 3.0), the header dict padded with spaces to a multiple of 64 bytes and
// ended by a newline, then `data`. `pad` false leaves the header unpadded (data at any offset).
std::string npy_bytes(const std::string& dict, const std::string& data, int major = 1, bool pad = true) {
  const size_t preamble = major == 1 ? 10 : 12;
  std::string header = dict;
  if (pad) header.append(63 - (preamble + header.size()) % 64, ' ');
  header += '\n';
  std::string bytes = "\x93NUMPY";
  bytes += static_cast<char>(major);
  bytes += '\0';
  const auto length = static_cast<uint32_t>(header.size());
  for (size_t i = 0; i < preamble - 8; ++i) bytes += static_cast<char>(length >> (8 * i));
  return bytes + header + data;
}

std::string npy_dict(const std::string& descr, const std::string& shape, const std::string& fortran = "False") {
  return "{'descr': '" + descr + "', 'fortran_order': " + fortran + ", 'shape': " + shape + ", }";
}

template <typename Id>
std::string id_bytes(const std::vector<Id>& ids) {
  return std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(Id));
}

void write_string(const std::filesystem::path& path, const std::string& bytes) {
  write_bytes(path, bytes.data(), bytes.size());
}

template <typename Id>
void write_npy(const std::filesystem::path& path, const std::vector<Id>& ids, const std::string& shape, int major = 1) {
  write_string(path, npy_bytes(npy_dict(sizeof(Id) == 2 ? "<u2" : "<u4", shape), id_bytes(ids), major));
}

template <typename To, typename From>
std::vector<To> convert(const std::vector<From>& ids) {
  return std::vector<To>(ids.begin(), ids.end());
}

// Every id of the file, through the width-independent accessor.
std::vector<uint32_t> ids_of(const TokenFile& file) {
  std::vector<uint32_t> ids(static_cast<size_t>(file.size()));
  for (int64_t i = 0; i < file.size(); ++i) ids[static_cast<size_t>(i)] = file.at(i);
  return ids;
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

// ---- TokenFile -----------------------------------------------------------------------------------

TEST(TokenFile, RawAndLlmcFilesGiveTheSameTokens) {
  ScratchDir dir;
  const std::vector<uint16_t> tokens = counting_tokens(1000, 50257);  // 2000 bytes: longer than a header
  write_raw(dir / "train.bin", tokens);
  write_llmc(dir / "shard.bin", tokens);

  const TokenFile raw(dir / "train.bin");
  const TokenFile llmc(dir / "shard.bin");
  EXPECT_EQ(raw.format(), TokenFile::Format::kRaw);
  EXPECT_EQ(llmc.format(), TokenFile::Format::kLlmc);
  EXPECT_EQ(raw.bytes_per_token(), 2);
  EXPECT_EQ(llmc.bytes_per_token(), 2);
  ASSERT_EQ(raw.size(), 1000);
  ASSERT_EQ(llmc.size(), 1000);
  EXPECT_EQ(ids_of(raw), convert<uint32_t>(tokens));
  EXPECT_EQ(ids_of(llmc), convert<uint32_t>(tokens));
  EXPECT_EQ(raw.path(), dir / "train.bin");
}

TEST(TokenFile, LlmcHeaderCountWinsOverTrailingBytes) {
  ScratchDir dir;
  write_llmc(dir / "shard.bin", counting_tokens(100), 1, 60);
  const TokenFile file(dir / "shard.bin");
  EXPECT_EQ(file.format(), TokenFile::Format::kLlmc);
  EXPECT_EQ(file.size(), 60);
  EXPECT_EQ(file.at(59), 59u);
}

TEST(TokenFile, ShortFileStartingWithTheMagicIsRaw) {
  ScratchDir dir;
  const int32_t magic = 20240520;
  std::vector<uint16_t> tokens(10, 0);
  std::memcpy(tokens.data(), &magic, sizeof(magic));  // 20 bytes: too short for an llm.c header
  write_raw(dir / "short.bin", tokens);
  const TokenFile file(dir / "short.bin");
  EXPECT_EQ(file.format(), TokenFile::Format::kRaw);
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

TEST(TokenFile, NpyFilesGiveTheSameTokensAsARawFile) {
  ScratchDir dir;
  const std::vector<uint16_t> tokens = counting_tokens(1000, 50257);
  write_raw(dir / "raw.bin", tokens);
  write_npy(dir / "u2.npy", tokens, "(1000,)");
  write_npy(dir / "u2_rows.npy", tokens, "(10, 100)");
  write_npy(dir / "u4.npy", convert<uint32_t>(tokens), "(1000,)");
  write_npy(dir / "u4_rows.npy", convert<uint32_t>(tokens), "(40, 25)");
  write_npy(dir / "v2.npy", tokens, "(1000,)", 2);
  write_npy(dir / "v3.npy", convert<uint32_t>(tokens), "(1000,)", 3);
  // The magic decides, not the name; a 1-D array is the same bytes in Fortran order.
  write_npy(dir / "train.bin", tokens, "(1000,)");
  write_string(dir / "fortran.npy", npy_bytes(npy_dict("<u2", "(1000,)", "True"), id_bytes(tokens)));
  // Keys in another order, double quotes, no trailing comma, no padding.
  write_string(dir / "plain.npy",
               npy_bytes("{\"shape\":(10,100),\"fortran_order\":False,\"descr\":\"<u2\"}", id_bytes(tokens), 1, false));

  const TokenFile raw(dir / "raw.bin");
  const std::vector<uint32_t> expected = ids_of(raw);
  for (const char* name : {"u2.npy", "u2_rows.npy", "u4.npy", "u4_rows.npy", "v2.npy", "v3.npy", "train.bin",
                           "fortran.npy", "plain.npy"}) {
    const TokenFile file(dir / name);
    EXPECT_EQ(file.format(), TokenFile::Format::kNpy) << name;
    EXPECT_EQ(file.bytes_per_token(), std::string(name).starts_with("u4") || std::string(name) == "v3.npy" ? 4 : 2)
        << name;
    EXPECT_EQ(ids_of(file), expected) << name;
  }
}

TEST(TokenFile, ReadsNpyDataAtAnyOffset) {
  ScratchDir dir;
  // An unpadded header puts the data at an odd offset: reads must not assume alignment.
  const std::vector<uint32_t> ids = {7, 128255, 65536, 3};
  std::string dict = npy_dict("<u4", "(4,)");
  while ((10 + dict.size() + 1) % 4 != 3) dict += ' ';
  const std::string bytes = npy_bytes(dict, id_bytes(ids), 1, false);
  write_string(dir / "odd.npy", bytes);
  const TokenFile file(dir / "odd.npy");
  EXPECT_EQ(ids_of(file), ids);
  std::vector<int32_t> out(4);
  file.read(0, 4, 128256, out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{7, 128255, 65536, 3}));
}

TEST(TokenFile, ThirtyTwoBitIdsSurviveInNpyAndLlmcLlama3Files) {
  ScratchDir dir;
  std::vector<uint32_t> ids(2000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint32_t>(i * 64 % 128256);  // up to 128192
  ids[1] = 65535;
  ids[2] = 65536;
  ids[3] = 128255;  // Llama 3's last id
  write_npy(dir / "ids.npy", ids, "(2000,)");
  write_llmc_llama3(dir / "llama3.bin", ids);
  for (const char* name : {"ids.npy", "llama3.bin"}) {
    const TokenFile file(dir / name);
    EXPECT_EQ(file.bytes_per_token(), 4) << name;
    EXPECT_EQ(ids_of(file), ids) << name;
    std::vector<int32_t> out(ids.size());
    file.read(0, file.size(), 128256, out.data());
    EXPECT_EQ(out, convert<int32_t>(ids)) << name;
  }
  EXPECT_EQ(TokenFile(dir / "llama3.bin").format(), TokenFile::Format::kLlmc);
}

TEST(TokenFile, ReadRefusesIdsOutsideTheVocabularyBeforeNarrowing) {
  ScratchDir dir;
  const auto path = dir / "ids.npy";
  std::vector<uint32_t> ids(100, 5);
  ids[40] = 128256;
  ids[70] = 0x80000000u;  // negative as int32: must not slip under the vocabulary size
  ids[90] = 0xFFFFFFFFu;  // -1 as int32
  write_npy(path, ids, "(100,)");
  const TokenFile file(path);
  std::vector<int32_t> out(100);
  expect_invalid_input([&] { file.read(0, 100, 128256, out.data()); }, path,
                       "token id 128256 at position 40 is outside the vocabulary of 128256 tokens");
  expect_invalid_input([&] { file.read(41, 59, 128256, out.data()); }, path,
                       "token id 2147483648 at position 70 is outside the vocabulary of 128256 tokens");
  expect_invalid_input([&] { file.read(71, 29, std::numeric_limits<int>::max(), out.data()); }, path,
                       "token id 4294967295 at position 90");
  EXPECT_NO_THROW(file.read(0, 40, 6, out.data()));
  EXPECT_NO_THROW(file.read(40, 1, 128257, out.data()));
  EXPECT_EQ(out[0], 128256);

  const std::initializer_list<std::tuple<int64_t, int64_t, int>> bad_calls = {{-1, 1, 10}, {0, 101, 10}, {100, 1, 10},
                                                                              {0, -1, 10}, {0, 1, 0},    {0, 1, -5}};
  for (const auto& [first, count, vocab] : bad_calls) {
    try {
      file.read(first, count, vocab, out.data());
      ADD_FAILURE() << "no error for [" << first << ", +" << count << ") under " << vocab;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInternal) << e.what();
    }
  }
}

TEST(TokenFile, RejectsMalformedNpyFilesNamingThem) {
  ScratchDir dir;
  const std::vector<uint16_t> tokens = counting_tokens(50);
  const std::string data = id_bytes(tokens);
  int index = 0;
  // Writes `bytes` to a fresh file and expects it refused with `detail`.
  auto refused = [&](const std::string& bytes, const std::string& detail) {
    const auto path = dir / ("bad" + std::to_string(index++) + ".bin");
    write_string(path, bytes);
    expect_invalid_input([&] { TokenFile f(path); }, path, detail);
  };
  auto with_dict = [&](const std::string& dict, const std::string& detail) { refused(npy_bytes(dict, data), detail); };

  // dtypes other than little-endian uint16 / uint32
  for (const char* descr : {">u2", ">u4", "|u1", "<i2", "<i4", "<u8", "<f2", "<f4", "|O", "=u2", "u2"}) {
    with_dict(npy_dict(descr, "(50,)"), std::string("has dtype '") + descr + "', expected '<u2' or '<u4'");
  }
  with_dict("{'descr': [('a', '<u2')], 'fortran_order': False, 'shape': (50,)}", "expected a quoted string");
  // shapes
  with_dict(npy_dict("<u2", "()"), "has shape (), expected 1-D (tokens) or 2-D");
  with_dict(npy_dict("<u2", "(5, 5, 2)"), "has shape (5, 5, 2), expected 1-D");
  with_dict(npy_dict("<u2", "(5, 10)", "True"), "2-D shape (5, 10) in Fortran order, expected C order");
  with_dict(npy_dict("<u2", "(50)"), "the shape is an integer in parentheses, not a tuple");
  with_dict(npy_dict("<u2", "(-50,)"), "expected a non-negative integer");
  with_dict(npy_dict("<u2", "(50.0,)"), "expected ',' or ')' in the shape");
  with_dict(npy_dict("<u2", "(50L,)"), "expected ',' or ')' in the shape");
  with_dict(npy_dict("<u2", "(99999999999999999999,)"), "integer too large");
  with_dict(npy_dict("<u2", "(51,)"), "has shape (51,) of '<u2' (102 bytes) but 100 bytes of data after its header");
  with_dict(npy_dict("<u2", "(49,)"), "has shape (49,) of '<u2' (98 bytes) but 100 bytes of data");
  with_dict(npy_dict("<u4", "(50,)"), "has shape (50,) of '<u4' (200 bytes) but 100 bytes of data");
  with_dict(npy_dict("<u2", "(0,)"), "has shape (0,) of '<u2' (0 bytes) but 100 bytes");
  refused(npy_bytes(npy_dict("<u2", "(0,)"), ""), "holds no tokens");
  refused(npy_bytes(npy_dict("<u2", "(0, 50)"), ""), "holds no tokens");
  // A product that wraps around 2^64 to the true size must not pass.
  with_dict(npy_dict("<u2", "(4611686018427387929, 2)"),
            "has shape (4611686018427387929, 2) of '<u2' (2^63 bytes or more) but 100");
  with_dict(npy_dict("<u2", "(9223372036854775807, 50)"),
            "has shape (9223372036854775807, 50) of '<u2' (2^63 bytes or more) but 100");
  with_dict(npy_dict("<u2", "(2305843009213693952, 8)"),
            "has shape (2305843009213693952, 8) of '<u2' (2^63 bytes or more) but 100");
  // the dict itself
  with_dict("['descr', '<u2']", "expected '{'");
  with_dict("{'descr': '<u2', 'shape': (50,)}", "lacks one of");
  with_dict("{'descr': '<u2', 'fortran_order': False, 'shape': (50,), 'extra': 1}",
            "unexpected or repeated key 'extra'");
  with_dict("{'descr': '<u2', 'descr': '<u2', 'fortran_order': False, 'shape': (50,)}", "repeated key 'descr'");
  with_dict("{'descr': '<u2', 'fortran_order': 0, 'shape': (50,)}", "expected True or False");
  with_dict("{'descr': '<u2', 'fortran_order': False, 'shape': (50,)} x", "unexpected characters after the header");
  with_dict("{'descr': '<u2' 'fortran_order': False, 'shape': (50,)}",
            "expected ',' or '}' after the value of 'descr'");
  with_dict("{'descr': '<u2, 'fortran_order': False, 'shape': (50,)}",
            "expected ',' or '}' after the value of 'descr'");
  with_dict("{'descr: <u2", "unsupported character in a string");  // the header's closing newline
  refused(std::string("\x93NUMPY\x01\0\x07\0{'descr", 17), "unterminated string");
  with_dict("{'descr': '<u\\x32', 'fortran_order': False, 'shape': (50,)}", "unsupported character");
  with_dict("{'descr': '<u2" + std::string(1, '\0') + "', 'fortran_order': False, 'shape': (50,)}",
            "unsupported character");
  with_dict("", "expected '{'");
  // the preamble
  refused("\x93NUMPY\x01", "ends inside its preamble (7 bytes)");
  refused(std::string("\x93NUMPY\x02\0\x10\0", 10), "ends inside its preamble (10 bytes)");
  std::string v4 = npy_bytes(npy_dict("<u2", "(50,)"), data);
  v4[6] = 4;
  refused(v4, "has format version 4.0, expected 1.0, 2.0 or 3.0");
  std::string v11 = npy_bytes(npy_dict("<u2", "(50,)"), data);
  v11[7] = 1;
  refused(v11, "has format version 1.1");
  std::string long_header = npy_bytes(npy_dict("<u2", "(50,)"), data);
  long_header[8] = '\xff';
  long_header[9] = '\x0f';  // 4095 bytes, more than the file
  refused(long_header, "declares a header of 4095 bytes but the file has 228 bytes");
  std::string absurd = npy_bytes(npy_dict("<u2", "(50,)"), data, 2);
  absurd.replace(8, 4, "\xff\xff\xff\xff");
  refused(absurd, "declares a header of 4294967295 bytes, more than the 65536 accepted");
  const std::string whole = npy_bytes(npy_dict("<u2", "(50,)"), data);
  refused(whole.substr(0, whole.size() - 1), "has shape (50,) of '<u2' (100 bytes) but 99 bytes of data");
  refused(whole.substr(0, 40), "declares a header of 118 bytes but the file has 40 bytes");
}

// A header may be 64 KiB of anything: a 60 KB key, dtype or a shape of thousands of dimensions used to
// be printed whole. Each message names the file and stays one short line.
TEST(TokenFile, LongHeaderValuesAreCutShortInMessages) {
  ScratchDir dir;
  const std::string data = id_bytes(counting_tokens(50));
  const std::string huge(60'000, 'k');
  std::string many = "(1";
  for (int i = 0; i < 10'000; ++i) many += ", 1";
  many += ")";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{'" + huge + "': 1, }", "unexpected or repeated key 'kkkk"},
      {"{'descr': '<u2' '" + huge + "': 1, }", "expected ',' or '}' after the value of 'descr'"},
      {npy_dict(huge, "(50,)"), "has dtype 'kkkk"},
      {npy_dict("<u2", many), "has shape (1, 1, 1, 1, ... 10001 dimensions), expected 1-D"},
  };
  int index = 0;
  for (const auto& [dict, detail] : cases) {
    const auto path = dir / ("long" + std::to_string(index++) + ".npy");
    write_string(path, npy_bytes(dict, data, 2));
    expect_invalid_input([&] { TokenFile f(path); }, path, detail);
    try {
      TokenFile f(path);
    } catch (const Error& e) {
      EXPECT_LT(std::string(e.what()).size(), path.string().size() + 400) << e.what();
    }
  }
}

TEST(TokenFile, RejectsMalformedLlmcLlama3FilesNamingThem) {
  ScratchDir dir;
  const std::vector<uint32_t> ids(50, 128000);
  const auto version = dir / "version.bin";
  write_llmc_llama3(version, ids, 1);
  expect_invalid_input([&] { TokenFile f(version); }, version, "llm.c Llama 3 token file version 1, expected 7");
  const auto too_many = dir / "too_many.bin";
  write_llmc_llama3(too_many, ids, 7, 51);
  expect_invalid_input([&] { TokenFile f(too_many); }, too_many, "declares 51 tokens (1228 bytes");
  const auto negative = dir / "negative.bin";
  write_llmc_llama3(negative, ids, 7, -2);
  expect_invalid_input([&] { TokenFile f(negative); }, negative, "declares a negative token count -2");
  const auto empty = dir / "empty.bin";
  write_llmc_llama3(empty, {});
  expect_invalid_input([&] { TokenFile f(empty); }, empty, "holds no tokens");
}

TEST(TokenFile, ReadsWhatNumpySaves) {
  if (std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0) GTEST_SKIP() << "needs numpy";
  ScratchDir dir;
  const std::string script =
      "import numpy as np, sys\n"
      "d = sys.argv[1]\n"
      "ids = (np.arange(3000, dtype=np.int64) * 97) % 128256\n"
      "np.save(d + '/u2.npy', (ids % 65536).astype(np.uint16))\n"
      "np.save(d + '/u4.npy', ids.astype(np.uint32).reshape(30, 100))\n"
      "np.save(d + '/u4f.npy', np.asfortranarray(ids.astype(np.uint32)))\n"
      "with open(d + '/v2.npy', 'wb') as f:\n"
      "    np.lib.format.write_array(f, ids.astype(np.uint32), version=(2, 0))\n"
      "np.save(d + '/be.npy', ids.astype('>u4'))\n"
      "np.save(d + '/f.npy', np.asfortranarray(ids.astype(np.uint32).reshape(30, 100)))\n";
  write_string(dir / "write.py", script);
  ASSERT_EQ(std::system(("/usr/bin/python3 " + (dir / "write.py").string() + " " + (dir / "").string()).c_str()), 0);

  std::vector<uint32_t> ids(3000);
  for (uint32_t i = 0; i < 3000; ++i) ids[i] = i * 97 % 128256;
  std::vector<uint32_t> low(ids);
  for (uint32_t& id : low) id %= 65536;
  EXPECT_EQ(ids_of(TokenFile(dir / "u2.npy")), low);
  EXPECT_EQ(TokenFile(dir / "u2.npy").bytes_per_token(), 2);
  EXPECT_EQ(ids_of(TokenFile(dir / "u4.npy")), ids);
  EXPECT_EQ(TokenFile(dir / "u4.npy").bytes_per_token(), 4);
  EXPECT_EQ(ids_of(TokenFile(dir / "u4f.npy")), ids);
  EXPECT_EQ(ids_of(TokenFile(dir / "v2.npy")), ids);
  expect_invalid_input([&] { TokenFile f(dir / "be.npy"); }, dir / "be.npy", "has dtype '>u4'");
  expect_invalid_input([&] { TokenFile f(dir / "f.npy"); }, dir / "f.npy", "in Fortran order");
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

TEST(SampleOrder, FillRefusesThirtyTwoBitIdsOutsideTheVocabulary) {
  ScratchDir dir;
  constexpr int kSeqLen = 8;
  const auto path = dir / "t.npy";
  std::vector<uint32_t> ids(200);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint32_t>(128056 + i);  // 128056..128255
  ids[37] = 128256;       // an input of sample 4 (tokens 32..40)
  ids[48] = 0x80000000u;  // the last target of sample 5 (tokens 40..48); negative as an int32
  write_npy(path, ids, "(200,)");
  const TokenFile file(path);
  SampleOrder order(file, kSeqLen, 11);
  std::vector<int32_t> inputs(kSeqLen), targets(kSeqLen);

  const int64_t g37 = index_of(order, 4);
  const int64_t g48 = index_of(order, 5);
  const int64_t g_last = index_of(order, 23);  // tokens 184..192
  ASSERT_GE(g37, 0);
  ASSERT_GE(g48, 0);
  ASSERT_GE(g_last, 0);
  expect_invalid_input([&] { order.fill(g37, 128256, inputs.data(), targets.data()); }, path,
                       "token id 128256 at position 37 is outside the vocabulary of 128256 tokens");
  expect_invalid_input([&] { order.fill(g48, 128256, inputs.data(), targets.data()); }, path,
                       "token id 2147483648 at position 48 is outside the vocabulary of 128256 tokens");
  order.fill(g_last, 128256, inputs.data(), targets.data());
  for (int t = 0; t < kSeqLen; ++t) {
    EXPECT_EQ(inputs[static_cast<size_t>(t)], 128056 + 184 + t);
    EXPECT_EQ(targets[static_cast<size_t>(t)], 128056 + 185 + t);
  }
}

}  // namespace
}  // namespace shardkit::trainer
