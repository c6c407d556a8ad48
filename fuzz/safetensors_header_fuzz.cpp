// The safetensors header parser on arbitrary bytes: the first 8 bytes give the file size the header
// is checked against (offsets past the end, overlaps, absurd shapes), the rest is the JSON header.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "base/error.hpp"
#include "ckpt/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  uint64_t file_size = 0;
  std::memcpy(&file_size, data, 8);
  try {
    shardkit::ckpt::safetensors::parse_header(std::string_view(reinterpret_cast<const char*>(data) + 8, size - 8),
                                              file_size, "fuzz.safetensors");
  } catch (const shardkit::Error&) {
  }
  return 0;
}
