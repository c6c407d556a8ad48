// Byte-level tokenisation: every byte of a text becomes one token id 0-255, written as a token file
// (little-endian uint16). A vocabulary of 256 needs no tokenizer files, which suits tests and samples.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>

namespace shardkit::trainer {

// Encodes `text` into the token file `out` (written to a temporary name, then renamed), streaming in
// blocks of 16 MiB; `progress`, if set, is called after each block with (bytes encoded, bytes in all).
// Returns the number of tokens. Error(kInvalidInput) for a missing or empty input.
int64_t encode_bytes(const std::filesystem::path& text, const std::filesystem::path& out,
                     const std::function<void(int64_t done, int64_t total)>& progress = {});

}  // namespace shardkit::trainer
