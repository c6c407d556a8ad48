// A reader of TensorBoard event files written for the tests from the published format, independent of
// shardkit's writer: TFRecord framing with both masked CRC-32C checked (a bitwise CRC, not the writer's
// table), and the `Event` protocol buffer decoded field by field (wall_time 1, step 2, file_version 3,
// summary 5 -> Summary.value 1 -> Value.tag 1, Value.simple_value 2).
#pragma once

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace shardkit::testing {

struct SummaryValue {
  std::string tag;
  float simple_value = 0;
};

struct Event {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  std::vector<SummaryValue> values;
};

// Every event of `file`, in order. std::runtime_error naming the record and what is wrong: a length or
// data CRC that does not match, a record cut short, a field of a wire type the schema does not give it.
std::vector<Event> read_event_file(const std::filesystem::path& file);

// The masked CRC-32C of TFRecord framing.
uint32_t masked_crc32c(const std::string& bytes);

}  // namespace shardkit::testing
