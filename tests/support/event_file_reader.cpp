#include "tests/support/event_file_reader.hpp"

#include <bit>
#include <cstring>
#include <fstream>
#include <iterator>

namespace shardkit::testing {
namespace {

uint32_t crc32c_bitwise(const std::string& bytes) {
  uint32_t crc = 0xFFFFFFFFu;
  for (const char ch : bytes) {
    crc ^= static_cast<unsigned char>(ch);
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

uint64_t little_endian(const std::string& bytes, size_t at, int size) {
  uint64_t v = 0;
  for (int i = 0; i < size; ++i) v |= uint64_t{static_cast<unsigned char>(bytes.at(at + i))} << (8 * i);
  return v;
}

// A protocol buffer message: its fields one at a time.
class Message {
 public:
  Message(std::string bytes, std::string what) : bytes_(std::move(bytes)), what_(std::move(what)) {}
  bool done() const { return at_ >= bytes_.size(); }

  // The next field's number and wire type.
  std::pair<uint32_t, uint32_t> key() {
    const uint64_t k = varint();
    return {static_cast<uint32_t>(k >> 3), static_cast<uint32_t>(k & 7)};
  }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      const auto b = static_cast<unsigned char>(take(1)[0]);
      v |= uint64_t{b & 0x7Fu} << shift;
      if ((b & 0x80) == 0) return v;
    }
    fail("a varint longer than 10 bytes");
  }
  uint64_t fixed(int size) { return little_endian(take(static_cast<size_t>(size)), 0, size); }
  std::string bytes() { return take(varint()); }
  [[noreturn]] void fail(const std::string& problem) const { throw std::runtime_error(what_ + ": " + problem); }

 private:
  std::string take(size_t n) {
    if (n > bytes_.size() - at_) fail("a field runs past the end of the message");
    std::string out = bytes_.substr(at_, n);
    at_ += n;
    return out;
  }
  std::string bytes_;
  std::string what_;
  size_t at_ = 0;
};

SummaryValue decode_value(Message m) {
  SummaryValue v;
  while (!m.done()) {
    const auto [field, type] = m.key();
    if (field == 1 && type == 2) {
      v.tag = m.bytes();
    } else if (field == 2 && type == 5) {
      v.simple_value = std::bit_cast<float>(static_cast<uint32_t>(m.fixed(4)));
    } else {
      m.fail("Summary.Value field " + std::to_string(field) + " of wire type " + std::to_string(type));
    }
  }
  return v;
}

Event decode_event(Message m, const std::string& what) {
  Event e;
  while (!m.done()) {
    const auto [field, type] = m.key();
    if (field == 1 && type == 1) {
      e.wall_time = std::bit_cast<double>(m.fixed(8));
    } else if (field == 2 && type == 0) {
      e.step = static_cast<int64_t>(m.varint());
    } else if (field == 3 && type == 2) {
      e.file_version = m.bytes();
    } else if (field == 5 && type == 2) {
      Message summary(m.bytes(), what + " summary");
      while (!summary.done()) {
        const auto [value_field, value_type] = summary.key();
        if (value_field != 1 || value_type != 2) summary.fail("Summary field " + std::to_string(value_field));
        e.values.push_back(decode_value(Message(summary.bytes(), what + " value")));
      }
    } else {
      m.fail("Event field " + std::to_string(field) + " of wire type " + std::to_string(type));
    }
  }
  return e;
}

}  // namespace

uint32_t masked_crc32c(const std::string& bytes) {
  const uint32_t crc = crc32c_bitwise(bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::vector<Event> read_event_file(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw std::runtime_error(file.string() + ": cannot open");
  const std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<Event> events;
  size_t at = 0;
  while (at < content.size()) {
    const std::string what =
        file.filename().string() + " record " + std::to_string(events.size()) + " at byte " + std::to_string(at);
    if (content.size() - at < 12) throw std::runtime_error(what + ": cut short in its header");
    const std::string length_bytes = content.substr(at, 8);
    const uint64_t length = little_endian(content, at, 8);
    if (little_endian(content, at + 8, 4) != masked_crc32c(length_bytes)) {
      throw std::runtime_error(what + ": the length's CRC does not match");
    }
    if (content.size() - at - 12 < length + 4) throw std::runtime_error(what + ": cut short in its data");
    const std::string data = content.substr(at + 12, length);
    if (little_endian(content, at + 12 + length, 4) != masked_crc32c(data)) {
      throw std::runtime_error(what + ": the data's CRC does not match");
    }
    events.push_back(decode_event(Message(data, what), what));
    at += 12 + length + 4;
  }
  return events;
}

}  // namespace shardkit::testing
