#include "trainer/monitor/event_file.hpp"

#include <fcntl.h>
#include <limits.h>
#include <unistd.h>

#include <bit>
#include <chrono>
#include <cstdio>

#include "base/crc32c.hpp"
#include "base/write_target.hpp"

namespace shardkit::trainer::monitor {
namespace {

// Protocol buffer wire types.
constexpr uint32_t kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_key(std::string& out, uint32_t field, uint32_t wire_type) {
  put_varint(out, (field << 3) | wire_type);
}

// Little-endian whatever the host's order: TFRecord and protobuf's fixed-width fields are.
void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes);
}

void put_wall_time(std::string& out, double wall_time) {
  put_key(out, 1, kFixed64);
  put_le(out, std::bit_cast<uint64_t>(wall_time), 8);
}

uint32_t masked_crc(std::string_view bytes) {
  const uint32_t crc = crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char host[HOST_NAME_MAX + 1] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) return "localhost";
  return host;
}

}  // namespace

std::string encode_file_version_event(double wall_time) {
  std::string event;
  put_wall_time(event, wall_time);
  put_bytes(event, 3, "brain.Event:2");
  return event;
}

std::string encode_scalar_event(double wall_time, int64_t step, std::string_view tag, float value) {
  std::string summary_value;
  put_bytes(summary_value, 1, tag);
  put_key(summary_value, 2, kFixed32);
  put_le(summary_value, std::bit_cast<uint32_t>(value), 4);
  std::string summary;
  put_bytes(summary, 1, summary_value);
  std::string event;
  put_wall_time(event, wall_time);
  put_key(event, 2, kVarint);
  put_varint(event, static_cast<uint64_t>(step));  // int64 as protobuf encodes it (two's complement)
  put_bytes(event, 5, summary);
  return event;
}

std::string frame_record(std::string_view data) {
  std::string length;
  put_le(length, data.size(), 8);
  std::string record = length;
  put_le(record, masked_crc(length), 4);
  record.append(data);
  put_le(record, masked_crc(data), 4);
  return record;
}

std::string event_file_name(int64_t unix_seconds, std::string_view host, int64_t pid) {
  char seconds[32];
  std::snprintf(seconds, sizeof(seconds), "%010lld", static_cast<long long>(unix_seconds));
  return "events.out.tfevents." + std::string(seconds) + "." + std::string(host) + "." + std::to_string(pid) + ".0";
}

EventFileSink::EventFileSink(const std::filesystem::path& folder) {
  const double now = now_seconds();
  // A host name is one path component (no '/'), so the file lands in `folder`. Appending (not
  // replacing) where the name exists keeps another run's events, should a pid repeat within a second.
  file_ = open_own_file(folder / event_file_name(static_cast<int64_t>(now), host_name(), ::getpid()),
                        O_WRONLY | O_APPEND | O_CREAT);
  append(file_, frame_record(encode_file_version_event(now)));
}

void EventFileSink::write(std::span<const Scalar> scalars) {
  // One write(2) a step: a reader following the file while the run goes on finds the step's events
  // together, and a disk that fills up cuts at most one record short (TensorBoard's reader stops at a
  // record whose length or CRC does not check out).
  std::string records;
  const double now = now_seconds();
  for (const Scalar& s : scalars) {
    records += frame_record(encode_scalar_event(now, s.samples, s.tag, static_cast<float>(s.value)));
  }
  append(file_, records);
}

std::string EventFileSink::describe() const {
  return "TensorBoard events to " + file_.path().string();
}

}  // namespace shardkit::trainer::monitor
