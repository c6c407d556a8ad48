// CRC-32C (Castagnoli: reflected polynomial 0x82F63B78, initial and final value 0xFFFFFFFF), the
// checksum of TFRecord framing, which TensorBoard's event files use. Table-driven, one byte at a time:
// the monitors checksum a few hundred bytes a step, so speed does not matter here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace shardkit {

// CRC-32C of `size` bytes at `data`.
uint32_t crc32c(const void* data, size_t size) noexcept;

inline uint32_t crc32c(std::string_view bytes) noexcept {
  return crc32c(bytes.data(), bytes.size());
}

}  // namespace shardkit
