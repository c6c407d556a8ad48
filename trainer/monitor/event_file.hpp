// TensorBoard's event files, written without TensorFlow or protobuf: each record is TFRecord-framed
//   uint64 length (little-endian) | uint32 masked CRC-32C of those 8 bytes | data | uint32 masked CRC-32C of data
// (mask: ((crc >> 15) | (crc << 17)) + 0xa282ead8), and holds one `Event` protocol buffer encoded by
// hand: wall_time (double, field 1), step (int64, field 2), file_version (string, field 3, the first
// record's "brain.Event:2") and summary (field 5): Summary { repeated Value value = 1 }, Value { string
// tag = 1; float simple_value = 2 }. One scalar per event, as PyTorch's SummaryWriter.add_scalar,
// which DeepSpeed's TensorBoard monitor calls, writes them.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "base/file_util.hpp"
#include "trainer/monitor/sink.hpp"

namespace shardkit::trainer::monitor {

// The first record's event: the file's format version.
std::string encode_file_version_event(double wall_time);
// An event holding one scalar summary: `tag` = `value` at `step`.
std::string encode_scalar_event(double wall_time, int64_t step, std::string_view tag, float value);
// `data` as one TFRecord.
std::string frame_record(std::string_view data);

// TensorBoard's name of an event file: events.out.tfevents.<seconds, 10 digits>.<host>.<pid>.0
// (TensorBoard reads every file of a folder whose name holds "tfevents", in name order).
std::string event_file_name(int64_t unix_seconds, std::string_view host, int64_t pid);

// An event file of its own in `folder` (which must exist), its first record written at once, one event
// per scalar with the samples as the event's step.
class EventFileSink : public Sink {
 public:
  explicit EventFileSink(const std::filesystem::path& folder);
  void write(std::span<const Scalar> scalars) override;
  std::string describe() const override;
  const std::filesystem::path& path() const noexcept { return file_.path(); }

 private:
  FileDescriptor file_;
};

}  // namespace shardkit::trainer::monitor
