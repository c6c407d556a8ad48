// The DeepSpeed config parser on arbitrary bytes (JSON with comments, as from a file) at world sizes
// 1-8: a config or one Error(kInvalidInput), never another exception or a crash.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "base/error.hpp"
#include "trainer/ds_config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int world_size = 1 + data[0] % 8;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  shardkit::trainer::AutoContext context;
  context.hidden_size = 768;
  try {
    shardkit::trainer::parse_ds_config_text(text, world_size, context, "fuzz.json");
  } catch (const shardkit::Error&) {
  }
  return 0;
}
