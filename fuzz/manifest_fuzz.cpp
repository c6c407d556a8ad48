// The manifest parser on arbitrary bytes: it must return a manifest or throw Error, never
// crash, hang, read out of bounds or overflow (ASan, UBSan).
#include <cstddef>
#include <cstdint>
#include <string>

#include "base/error.hpp"
#include "ckpt/manifest.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    shardkit::ckpt::parse_manifest(std::string(reinterpret_cast<const char*>(data), size), "fuzz/manifest.json");
  } catch (const shardkit::Error&) {
  }
  return 0;
}
