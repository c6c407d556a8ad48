// Token files on arbitrary bytes: whatever the first bytes claim (a NumPy header, an llm.c header, raw
// ids), TokenFile either refuses the file with one Error(kInvalidInput) or maps it and every id reads
// back, checked against the vocabulary, without a crash or an out-of-bounds access. Seeds: a .npy
// file of each id width and an llm.c file of each version, written at start-up into the folder named by
// SHARDKIT_FUZZ_SEEDS (scripts/fuzz.sh passes the corpus folder), so no binary seed is kept in the
// repository.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "trainer/data.hpp"

namespace {

// Where each input is written for TokenFile to map (it reads files only): one file in the working
// directory (scripts/fuzz.sh runs in build-fuzz), overwritten by every input and every run.
const std::filesystem::path kScratch = "token_file_fuzz.input";

void write(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

template <typename Id>
std::string ids(std::initializer_list<Id> values) {
  std::string s;
  for (Id v : values) s.append(reinterpret_cast<const char*>(&v), sizeof(v));
  return s;
}

std::string npy(const std::string& descr, const std::string& shape, const std::string& data) {
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  header.append(64 - (10 + header.size() + 1) % 64, ' ');
  header += '\n';
  const auto length = static_cast<uint16_t>(header.size());
  return std::string("\x93NUMPY\x01\x00", 8) + std::string(reinterpret_cast<const char*>(&length), 2) + header + data;
}

std::string llmc(int32_t magic, int32_t version, const std::string& data, int32_t count) {
  std::vector<int32_t> header(256, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = count;
  return std::string(reinterpret_cast<const char*>(header.data()), header.size() * 4) + data;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* seeds = std::getenv("SHARDKIT_FUZZ_SEEDS")) {
    const std::filesystem::path dir(seeds);
    write(dir / "token_u2.npy", npy("<u2", "(6,)", ids<uint16_t>({1, 2, 3, 65535, 7, 9})));
    write(dir / "token_u4_2d.npy", npy("<u4", "(2, 3)", ids<uint32_t>({1, 128255, 3, 4, 70000, 6})));
    write(dir / "token_llmc_gpt2.bin", llmc(20240520, 1, ids<uint16_t>({5, 6, 7, 8}), 4));
    write(dir / "token_llmc_llama3.bin", llmc(20240801, 7, ids<uint32_t>({5, 128000, 7}), 3));
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  write(kScratch, std::string(reinterpret_cast<const char*>(data), size));
  try {
    const shardkit::trainer::TokenFile file(kScratch);
    std::vector<int32_t> out(static_cast<size_t>(file.size()));
    file.read(0, file.size(), 1 << 17, out.data());
  } catch (const shardkit::Error& e) {
    if (e.kind() != shardkit::ErrorKind::kInvalidInput) std::abort();
  }
  return 0;
}
