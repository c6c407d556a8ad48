// What the fuzzers of whole checkpoint folders share: a fuzz input is a list of records (a role byte,
// a 4-byte little-endian length and that many bytes), each written as one file of a scratch folder, and
// real checkpoints are packed the same way as seeds.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <string_view>

#include "base/error.hpp"

namespace shardkit::fuzz {

inline void write_file(const std::filesystem::path& path, std::string_view bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void append_record(std::string& out, int role, const std::string& bytes) {
  out.push_back(static_cast<char>(role));
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((bytes.size() >> (8 * i)) & 0xff));
  out += bytes;
}

// Calls on_record(role, bytes) for each record of data[at, size); a length past the end is cut short.
template <typename OnRecord>
void for_each_record(const uint8_t* data, size_t size, size_t at, OnRecord on_record) {
  while (at + 5 <= size) {
    const int role = data[at];
    uint32_t length = 0;
    for (int i = 0; i < 4; ++i) length |= static_cast<uint32_t>(data[at + 1 + static_cast<size_t>(i)]) << (8 * i);
    at += 5;
    const size_t n = std::min<size_t>(length, size - at);
    on_record(role, std::string_view(reinterpret_cast<const char*>(data) + at, n));
    at += n;
  }
}

// Reads the first few values of every tensor's `states` states through a checkpoint's read(state,
// tensor, offset, out): the mapping onto the files is exercised; a refusal is an answer too.
template <typename Checkpoint>
void read_a_few(const Checkpoint& ckpt, int states) {
  float out[8];
  for (size_t t = 0; t < ckpt.table().size(); ++t) {
    const auto n = static_cast<size_t>(std::min<int64_t>(ckpt.table()[t].numel(), 8));
    for (int state = 0; state < states; ++state) {
      try {
        ckpt.read(state, static_cast<int>(t), 0, std::span<float>(out, n));
      } catch (const shardkit::Error&) {
      }
    }
  }
}

}  // namespace shardkit::fuzz
