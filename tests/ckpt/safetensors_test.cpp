#include "ckpt/safetensors.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <thread>

#include "base/error.hpp"

namespace shardkit::ckpt::safetensors {
namespace {

namespace fs = std::filesystem;

// A fresh directory, removed with its content at the end of the test.
class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern = (fs::temp_directory_path() / "safetensors_test.XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  fs::path operator/(const std::string& name) const { return path_ / name; }

 private:
  fs::path path_;
};

std::string le64(uint64_t value) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((value >> (8 * i)) & 0xff);
  return out;
}

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_all(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A safetensors file: length, header, then `data_bytes` bytes of a pattern.
std::string file_bytes(const std::string& header, uint64_t data_bytes) {
  std::string out = le64(header.size()) + header;
  for (uint64_t i = 0; i < data_bytes; ++i) out += static_cast<char>(i * 7 + 1);
  return out;
}

std::span<const std::byte> as_bytes(const std::string& s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

// Runs `f`, expects an Error of `kind` whose message starts with `where` and contains `needle`.
void expect_error(const std::function<void()>& f, ErrorKind kind, const std::string& where, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing \"" << needle << "\"";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(e.kind(), kind) << message;
    EXPECT_EQ(message.rfind(where, 0), 0u) << "message does not start with the file: " << message;
    EXPECT_NE(message.find(needle), std::string::npos) << "\"" << needle << "\" not in: " << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << "not one line: " << message;
  }
}

// parse_header on `header` for a file holding exactly `data_bytes` after it (plus `extra`, possibly negative).
Header parse(const std::string& header, uint64_t data_bytes, int64_t extra = 0) {
  return parse_header(header, 8 + header.size() + data_bytes + static_cast<uint64_t>(extra), "dir/m.safetensors");
}

std::string tensor_json(const std::string& dtype, const std::string& shape, uint64_t begin, uint64_t end) {
  return "{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" + std::to_string(begin) + "," +
         std::to_string(end) + "]}";
}

// ---- parse_header: valid headers -------------------------------------------------------------------

TEST(SafetensorsParse, ReadsTensorsSortedByOffsetWithMetadata) {
  // Keys in no particular order, as older writers produced; scalars and empty tensors included.
  const std::string header =
      "{\"w\":" + tensor_json("F32", "[2,3]", 8, 32) +
      ",\"__metadata__\":{\"format\":\"pt\",\"note\":\"x\"},\"scalar\":" + tensor_json("I64", "[]", 0, 8) +
      ",\"empty\":" + tensor_json("BF16", "[0,3]", 32, 32) + ",\"h\":" + tensor_json("F16", "[3]", 32, 38) + "}";
  const Header h = parse(header, 38);
  EXPECT_EQ(h.data_start, 8 + header.size());
  EXPECT_EQ(h.data_size(), 38u);
  EXPECT_EQ(h.metadata, (std::map<std::string, std::string>{{"format", "pt"}, {"note", "x"}}));
  ASSERT_EQ(h.tensors.size(), 4u);
  EXPECT_EQ(h.tensors[0].name, "scalar");
  EXPECT_TRUE(h.tensors[0].shape.empty());
  EXPECT_EQ(h.tensors[1].name, "w");
  EXPECT_EQ(h.tensors[1].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(h.tensors[1].dtype, "F32");
  EXPECT_EQ(h.tensors[2].name, "empty");  // [32, 32] sorts before [32, 38]
  EXPECT_EQ(h.tensors[2].size(), 0u);
  EXPECT_EQ(h.tensors[3].name, "h");
  ASSERT_NE(h.find("w"), nullptr);
  EXPECT_EQ(h.find("w")->begin, 8u);
  EXPECT_EQ(h.find("empty")->shape, (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(h.find("missing"), nullptr);
  EXPECT_EQ(h.find("__metadata__"), nullptr);
}

TEST(SafetensorsParse, AcceptsEmptyHeadersAndJsonWhitespace) {
  EXPECT_TRUE(parse("{}", 0).tensors.empty());
  EXPECT_TRUE(parse("{}      ", 0).tensors.empty());  // the reference writer's padding
  const Header h = parse(" \n{\"a\" : " + tensor_json("U8", "[2]", 0, 2) + "}\t  ", 2);
  ASSERT_EQ(h.tensors.size(), 1u);
  EXPECT_EQ(h.tensors[0].end, 2u);
  EXPECT_TRUE(h.metadata.empty());
  EXPECT_TRUE(parse("{\"__metadata__\":{}}", 0).metadata.empty());
}

TEST(SafetensorsParse, AcceptsEveryDtypeAndPackedSubByteTensors) {
  // F4: 4 elements are 2 bytes; F6: 4 elements are 3 bytes.
  const std::string header = "{\"f4\":" + tensor_json("F4", "[4]", 0, 2) +
                             ",\"f6\":" + tensor_json("F6_E3M2", "[2,2]", 2, 5) +
                             ",\"c\":" + tensor_json("C64", "[1]", 5, 13) + "}";
  EXPECT_EQ(parse(header, 13).tensors.size(), 3u);
  const std::vector<std::pair<std::string, size_t>> bits = {
      {"BOOL", 8},    {"F4", 4},      {"F6_E2M3", 6}, {"F6_E3M2", 6},     {"U8", 8},          {"I8", 8},
      {"F8_E5M2", 8}, {"F8_E4M3", 8}, {"F8_E8M0", 8}, {"F8_E4M3FNUZ", 8}, {"F8_E5M2FNUZ", 8}, {"I16", 16},
      {"U16", 16},    {"F16", 16},    {"BF16", 16},   {"I32", 32},        {"U32", 32},        {"F32", 32},
      {"C64", 64},    {"F64", 64},    {"I64", 64},    {"U64", 64}};
  for (const auto& [dtype, n] : bits) EXPECT_EQ(dtype_bits(dtype), n) << dtype;
  EXPECT_EQ(dtype_bits("f32"), 0u);
  EXPECT_EQ(dtype_bits("F128"), 0u);
  EXPECT_EQ(dtype_bits(""), 0u);
}

// ---- parse_header: every violation -----------------------------------------------------------------

struct BadHeader {
  const char* what;
  std::string header;
  uint64_t data_bytes;
  int64_t extra;       // bytes added to (or taken from) the file size that the tensors need
  std::string needle;  // expected in the message
};

TEST(SafetensorsParse, RejectsEachViolationNamingTheFileAndTensor) {
  const std::string f32x2 = tensor_json("F32", "[2]", 0, 8);
  std::string rank65 = "[1";
  for (int i = 1; i < 65; ++i) rank65 += ",1";
  rank65 += "]";
  const std::vector<BadHeader> cases = {
      {"array", "[1,2]", 0, 0, "not a JSON object"},
      {"string", "\"x\"", 0, 0, "not a JSON object"},
      {"number", "5", 0, 0, "not a JSON object"},
      {"empty text", "", 0, 0, "not valid JSON"},
      {"syntax", "{\"a\":", 0, 0, "not valid JSON"},
      {"garbage after", "{} x", 0, 0, "not valid JSON"},
      {"NUL padding", std::string("{}\0\0", 4), 0, 0, "not valid JSON (NUL byte at byte 2)"},
      {"byte-order mark", "\xef\xbb\xbf{}", 0, 0, "byte-order mark"},
      {"NUL then more JSON", std::string("{}\0{\"t\":1}", 11), 0, 0, "not valid JSON"},
      {"invalid UTF-8", "{\"\xff\":1}", 0, 0, "not valid JSON"},
      {"metadata number", "{\"__metadata__\":{\"format\":1}}", 0, 0, "__metadata__ value of 'format' is a number"},
      {"metadata nested", "{\"__metadata__\":{\"a\":{}}}", 0, 0, "__metadata__ value of 'a' is an object"},
      {"metadata not object", "{\"__metadata__\":\"pt\"}", 0, 0, "__metadata__ is a string, not an object"},
      {"tensor not object", "{\"t\":[1]}", 0, 0, "tensor 't' is an array"},
      {"unknown dtype", "{\"t\":" + tensor_json("F33", "[2]", 0, 8) + "}", 8, 0, "tensor 't': unknown dtype 'F33'"},
      {"lower-case dtype", "{\"t\":" + tensor_json("f32", "[2]", 0, 8) + "}", 8, 0, "unknown dtype 'f32'"},
      {"dtype not string", "{\"t\":{\"dtype\":5,\"shape\":[],\"data_offsets\":[0,0]}}", 0, 0, "'t': dtype is a number"},
      {"negative dim", "{\"t\":" + tensor_json("F32", "[-1]", 0, 0) + "}", 0, 0, "'t': negative dimension -1"},
      {"minus zero dim", "{\"t\":" + tensor_json("F32", "[-0]", 0, 0) + "}", 0, 0, "'t': negative dimension -0"},
      {"fractional dim", "{\"t\":" + tensor_json("F32", "[1.5]", 0, 0) + "}", 0, 0, "'t': shape holds a non-integer"},
      {"dim beyond 64 bits", "{\"t\":" + tensor_json("F32", "[99999999999999999999]", 0, 0) + "}", 0, 0,
       "'t': shape holds a non-integer"},
      {"dim beyond int64", "{\"t\":" + tensor_json("F32", "[18446744073709551615]", 0, 0) + "}", 0, 0,
       "'t': dimension 18446744073709551615 is too large"},
      {"shape not array", "{\"t\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", 8, 0,
       "'t': shape is a number"},
      {"nested shape", "{\"t\":" + tensor_json("F32", "[[2]]", 0, 8) + "}", 8, 0, "'t': shape holds an array"},
      {"element overflow", "{\"t\":" + tensor_json("F32", "[4294967296,4294967296,2]", 0, 8) + "}", 8, 0,
       "'t': shape has more elements than 64 bits can count"},
      {"bit overflow", "{\"t\":" + tensor_json("F32", "[2305843009213693952]", 0, 8) + "}", 8, 0, "'t': size in bits"},
      {"odd bits", "{\"t\":" + tensor_json("F4", "[3]", 0, 2) + "}", 2, 0, "'t': 3 elements of 4 bits are not a whole"},
      {"odd bits F6", "{\"t\":" + tensor_json("F6_E2M3", "[2]", 0, 2) + "}", 2, 0, "'t': 2 elements of 6 bits"},
      {"byte size mismatch", "{\"t\":" + tensor_json("F32", "[2,3]", 0, 20) + "}", 20, 0,
       "'t': data_offsets span 20 bytes, but dtype F32 and its shape need 24"},
      {"end before begin", "{\"t\":" + tensor_json("U8", "[0]", 8, 4) + "}", 8, 0,
       "'t': data_offsets [8, 4] end before"},
      {"not starting at 0", "{\"t\":" + tensor_json("F32", "[2]", 4, 12) + "}", 12, 0, "'t': begins at data byte 4"},
      {"hole", "{\"a\":" + f32x2 + ",\"b\":" + tensor_json("F32", "[1]", 12, 16) + "}", 16, 0,
       "tensor 'b': begins at data byte 12, leaving bytes [8, 12) to no tensor (a hole)"},
      {"overlap", "{\"a\":" + f32x2 + ",\"b\":" + tensor_json("F32", "[2]", 4, 12) + "}", 12, 0,
       "tensor 'b': begins at data byte 4, inside tensor 'a' which ends at 8 (overlap)"},
      {"same range twice", "{\"a\":" + f32x2 + ",\"b\":" + f32x2 + "}", 8, 0, "(overlap)"},
      {"trailing bytes", "{\"a\":" + f32x2 + "}", 8, 1, "(trailing bytes)"},
      {"data truncated", "{\"a\":" + f32x2 + "}", 8, -1, "(truncated)"},
      {"duplicate tensor", "{\"a\":" + f32x2 + ",\"a\":" + tensor_json("F32", "[2]", 8, 16) + "}", 16, 0,
       "tensor 'a' appears twice"},
      {"duplicate tensor, same range", "{\"a\":" + f32x2 + ",\"a\":" + f32x2 + "}", 8, 0, "tensor 'a' appears twice"},
      {"duplicate metadata", "{\"__metadata__\":{},\"__metadata__\":{}}", 0, 0, "__metadata__ appears twice"},
      {"duplicate metadata key", "{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0, 0, "key 'k' appears twice"},
      {"duplicate field", "{\"t\":{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}", 1, 0,
       "'t': field dtype appears twice"},
      {"unknown field", "{\"t\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1],\"strides\":[]}}", 1, 0,
       "'t': unknown field 'strides'"},
      {"missing field", "{\"t\":{\"dtype\":\"U8\",\"shape\":[]}}", 0, 0, "'t': field data_offsets is missing"},
      {"three offsets", "{\"t\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1,2]}}", 2, 0,
       "'t': data_offsets has more than 2"},
      {"one offset", "{\"t\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[1]}}", 1, 0, "'t': data_offsets has 1"},
      {"negative offset", "{\"t\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[-1,0]}}", 0, 0,
       "'t': negative data offset -1"},
      {"empty name", "{\"\":" + f32x2 + "}", 8, 0, "empty tensor name"},
      {"long name", "{\"" + std::string(1025, 'n') + "\":" + f32x2 + "}", 8, 0, "tensor name of 1025 bytes"},
      {"NUL in name", "{\"a\\u0000b\":" + f32x2 + "}", 8, 0, "tensor name 'a\\x00b' contains a NUL"},
      {"deep nesting", "{\"t\":{\"shape\":" + std::string(100000, '[') + "}}", 0, 0, "'t': shape holds an array"},
      {"rank above limit", "{\"t\":" + tensor_json("U8", rank65, 0, 1) + "}", 1, 0,
       "shape has more than 64 dimensions"},
  };
  for (const BadHeader& c : cases) {
    SCOPED_TRACE(c.what);
    expect_error([&] { parse(c.header, c.data_bytes, c.extra); }, ErrorKind::kCorrupt, "dir/m.safetensors: ", c.needle);
  }
}

TEST(SafetensorsParse, RejectsHeadersThatDoNotFitTheFileOrTheLimit) {
  expect_error([] { parse_header("{}", 9, "f.safetensors"); }, ErrorKind::kCorrupt,
               "f.safetensors: ", "header of 2 bytes does not fit in a file of 9 bytes");
  const std::string huge(kMaxHeaderBytes + 1, ' ');
  expect_error([&] { parse_header(huge, 8 + huge.size(), "f.safetensors"); }, ErrorKind::kCorrupt,
               "f.safetensors: ", "exceeds the limit of 100000000");
}

TEST(SafetensorsParse, TheLastValidTensorOfAManyTensorHeaderIsFound) {
  std::string header = "{";
  uint64_t offset = 0;
  for (int i = 0; i < 2000; ++i) {
    if (i > 0) header += ',';
    header += "\"t" + std::to_string(i) + "\":" + tensor_json("F16", "[3]", offset, offset + 6);
    offset += 6;
  }
  header += "}";
  const Header h = parse(header, offset);
  ASSERT_EQ(h.tensors.size(), 2000u);
  ASSERT_NE(h.find("t1999"), nullptr);
  EXPECT_EQ(h.find("t1999")->begin, 1999u * 6);
}

// ---- Reader on files ---------------------------------------------------------------------------------

TEST(SafetensorsReader, RejectsBadLengthFieldsBeforeReadingTheHeader) {
  ScratchDir dir;
  const fs::path short_file = dir / "short.safetensors";
  write_all(short_file, std::string(5, '\0'));
  expect_error([&] { Reader r(short_file); }, ErrorKind::kCorrupt, short_file.string(), "too short");

  const fs::path past_end = dir / "past_end.safetensors";
  write_all(past_end, le64(100) + "{}");
  expect_error([&] { Reader r(past_end); }, ErrorKind::kCorrupt, past_end.string(),
               "header length 100 runs past the end of the file (10 bytes)");

  const fs::path huge = dir / "huge.safetensors";
  write_all(huge, le64(kMaxHeaderBytes + 1) + "{}");
  expect_error([&] { Reader r(huge); }, ErrorKind::kCorrupt, huge.string(), "exceeds the limit of 100000000");

  const fs::path enormous = dir / "enormous.safetensors";
  write_all(enormous, le64(~uint64_t{0}) + "{}");
  expect_error([&] { Reader r(enormous); }, ErrorKind::kCorrupt, enormous.string(), "exceeds the limit");

  const fs::path trailing = dir / "trailing.safetensors";
  write_all(trailing, file_bytes("{\"a\":" + tensor_json("U8", "[4]", 0, 4) + "}", 5));
  expect_error([&] { Reader r(trailing); }, ErrorKind::kCorrupt, trailing.string(), "(trailing bytes)");

  expect_error([&] { Reader r(dir / "missing.safetensors"); }, ErrorKind::kInvalidInput,
               (dir / "missing.safetensors").string(), "no such file");
}

TEST(SafetensorsReader, ReadsTensorBytesOfAHandMadeFile) {
  ScratchDir dir;
  const fs::path file = dir / "m.safetensors";
  const std::string header =
      "{\"a\":" + tensor_json("U8", "[3]", 0, 3) + ",\"b\":" + tensor_json("U8", "[5]", 3, 8) + "}";
  const std::string bytes = file_bytes(header, 8);
  write_all(file, bytes);
  const Reader reader(file);
  EXPECT_EQ(reader.path(), file);
  const TensorInfo* b = reader.header().find("b");
  ASSERT_NE(b, nullptr);
  std::string out(3, '\0');
  reader.read(*b, 2, std::as_writable_bytes(std::span<char>(out.data(), out.size())));
  EXPECT_EQ(out, bytes.substr(8 + header.size() + 3 + 2, 3));
  // A range past the tensor is a caller bug.
  expect_error([&] { reader.read(*b, 3, std::as_writable_bytes(std::span<char>(out.data(), out.size()))); },
               ErrorKind::kInternal, file.string(), "outside tensor 'b' of 5 bytes");
  expect_error([&] { reader.read(*b, 6, {}); }, ErrorKind::kInternal, file.string(), "outside tensor 'b'");
}

// ---- Writer -------------------------------------------------------------------------------------------

TEST(SafetensorsWriter, WritesTheReferenceWritersExactBytes) {
  ScratchDir dir;
  // Vectors of the reference implementation's own tests: no metadata, no padding needed (N = 64) ...
  {
    const fs::path file = dir / "a.safetensors";
    Writer w(file, {{"attn.0", "F32", {1, 2, 3}}}, {});
    std::string data;
    for (const float x : {0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f}) data.append(reinterpret_cast<const char*>(&x), 4);
    w.write("attn.0", 0, as_bytes(data));
    w.finish();
    const std::string expected =
        le64(64) + R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})" + data;
    EXPECT_EQ(read_all(file), expected);
    EXPECT_EQ(w.file_size(), expected.size());
  }
  // ... 7 spaces of padding (N = 72) ...
  {
    const fs::path file = dir / "b.safetensors";
    Writer w(file, {{"attn0", "F32", {1, 1, 2, 3}}}, {});
    w.finish();
    EXPECT_EQ(read_all(file), le64(72) + R"({"attn0":{"dtype":"F32","shape":[1,1,2,3],"data_offsets":[0,24]}})" +
                                  std::string(7, ' ') + std::string(24, '\0'));
  }
  // ... and the empty files, with and without metadata.
  {
    const fs::path file = dir / "c.safetensors";
    Writer(file, {}, {}).finish();
    EXPECT_EQ(read_all(file), le64(8) + "{}      ");
    const fs::path with_metadata = dir / "d.safetensors";
    Writer(with_metadata, {}, {{"framework", "pt"}}).finish();
    EXPECT_EQ(read_all(with_metadata), le64(40) + R"({"__metadata__":{"framework":"pt"}})" + "     ");
  }
}

TEST(SafetensorsWriter, HeaderIsCompactMetadataFirstTensorsInOffsetOrder) {
  ScratchDir dir;
  const fs::path file = dir / "m.safetensors";
  Writer w(file, {{"b", "F32", {2, 3}}, {"a", "F16", {2}}, {"c", "I64", {}}}, {{"format", "pt"}});
  const std::string expected_header =
      R"({"__metadata__":{"format":"pt"},"c":{"dtype":"I64","shape":[],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"F32","shape":[2,3],"data_offsets":[8,32]},"a":{"dtype":"F16","shape":[2],"data_offsets":[32,36]}})"
      "     ";  // 195 bytes + 5 spaces = 200
  EXPECT_EQ(w.header_text(), expected_header);
  EXPECT_EQ(w.data_offset("c"), 208u);
  EXPECT_EQ(w.data_offset("b"), 216u);
  EXPECT_EQ(w.data_offset("a"), 240u);
  EXPECT_EQ(w.tensor_bytes("b"), 24u);
  EXPECT_EQ(w.file_size(), 244u);
  w.finish();
  const std::string bytes = read_all(file);
  ASSERT_EQ(bytes.size(), 244u);
  EXPECT_EQ(bytes.substr(0, 8), le64(200));
  EXPECT_EQ(bytes.substr(8, 200), expected_header);
}

TEST(SafetensorsWriter, EscapesNamesAsJson) {
  ScratchDir dir;
  const fs::path file = dir / "m.safetensors";
  const std::string odd = "q\"b\\s\n\x01/é";
  Writer w(file, {{odd, "U8", {1}}}, {{"k\"", "v\t"}});
  const std::string& text = w.header_text();
  EXPECT_EQ(text.substr(0, text.find_last_not_of(' ') + 1),
            R"({"__metadata__":{"k\"":"v\t"},"q\"b\\s\n\u0001/é":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})");
  w.finish();
  const Reader r(file);
  ASSERT_NE(r.header().find(odd), nullptr);
  EXPECT_EQ(r.header().metadata.at("k\""), "v\t");
}

TEST(SafetensorsWriter, DataStartsEightByteAlignedForAnyNameLength) {
  ScratchDir dir;
  for (int length = 1; length <= 17; ++length) {
    const fs::path file = dir / ("m" + std::to_string(length) + ".safetensors");
    Writer w(file, {{std::string(length, 'x'), "F64", {3}}}, {{"format", "pt"}});
    EXPECT_EQ(w.data_offset(std::string(length, 'x')) % 8, 0u) << length;
    EXPECT_EQ(w.header_text().size() % 8, 0u) << length;
    EXPECT_EQ(w.header_text().back() == ' ', w.header_text().find_last_not_of(' ') + 1 < w.header_text().size());
    w.finish();
    EXPECT_EQ(Reader(file).header().data_start % 8, 0u);
  }
}

TEST(SafetensorsWriter, OrdersByDtypeDescendingThenByName) {
  ScratchDir dir;
  const fs::path file = dir / "m.safetensors";
  Writer w(file,
           {{"z", "U8", {3}},
            {"a", "F16", {2}},
            {"m", "F64", {1}},
            {"b", "F32", {1}},
            {"c", "I64", {}},
            {"y", "BF16", {1}},
            {"x", "BOOL", {1}},
            {"d", "F16", {1}},
            {"B", "F16", {1}},
            {"u", "U64", {1}}},
           {});
  // The reference's dtype order, descending: U64, I64, F64, F32, BF16, F16, U8, BOOL; names byte-wise.
  const std::vector<std::pair<std::string, std::pair<uint64_t, uint64_t>>> expected = {
      {"u", {0, 8}},   {"c", {8, 16}},  {"m", {16, 24}}, {"b", {24, 28}}, {"y", {28, 30}},
      {"B", {30, 32}}, {"a", {32, 36}}, {"d", {36, 38}}, {"z", {38, 41}}, {"x", {41, 42}}};
  ASSERT_EQ(w.tensors().size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(w.tensors()[i].name, expected[i].first) << i;
    EXPECT_EQ(w.tensors()[i].begin, expected[i].second.first) << i;
    EXPECT_EQ(w.tensors()[i].end, expected[i].second.second) << i;
  }
  w.finish();
  const Reader r(file);
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(r.header().tensors[i].name, expected[i].first) << i;
}

TEST(SafetensorsWriter, ConcurrentWritesFromSeveralThreadsProduceTheRightFile) {
  ScratchDir dir;
  const fs::path file = dir / "m.safetensors";
  const std::vector<TensorSpec> specs = {
      {"big", "F32", {1000, 263}}, {"mid", "BF16", {4097}}, {"small", "U8", {7}}, {"empty", "F32", {0}}};
  Writer w(file, specs, {{"format", "pt"}});
  // Expected content of each tensor: a pattern that differs per tensor and per byte.
  std::map<std::string, std::string> content;
  for (const TensorSpec& s : specs) {
    std::string bytes(w.tensor_bytes(s.name), '\0');
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((i * 131 + s.name.size() * 17) >> 1);
    content[s.name] = bytes;
  }
  constexpr int kThreads = 8;
  constexpr size_t kChunk = 1000;  // not a divisor of the sizes: chunks straddle nothing, ends are short
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      size_t chunk_index = 0;
      for (const auto& [name, bytes] : content) {
        for (size_t offset = 0; offset < bytes.size(); offset += kChunk, ++chunk_index) {
          if (chunk_index % kThreads != static_cast<size_t>(t)) continue;
          const size_t n = std::min(kChunk, bytes.size() - offset);
          w.write(name, offset, as_bytes(bytes).subspan(offset, n));
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  w.finish();

  const Reader r(file);
  EXPECT_EQ(r.header().metadata.at("format"), "pt");
  EXPECT_EQ(fs::file_size(file), w.file_size());
  for (const auto& [name, bytes] : content) {
    const TensorInfo* t = r.header().find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(r.header().data_start + t->begin, w.data_offset(name));
    std::string back(bytes.size(), '\0');
    r.read(*t, 0, std::as_writable_bytes(std::span<char>(back.data(), back.size())));
    EXPECT_EQ(back, bytes) << name;
  }
  // The raw file agrees too: each tensor's bytes sit at data_offset.
  const std::string raw = read_all(file);
  EXPECT_EQ(raw.substr(w.data_offset("mid"), content["mid"].size()), content["mid"]);
}

TEST(SafetensorsWriter, ReaderReadsBackShapesDtypesAndMetadata) {
  ScratchDir dir;
  const fs::path file = dir / "m.safetensors";
  Writer w(file, {{"scalar", "F32", {}}, {"w", "BF16", {2, 3}}, {"none", "I32", {4, 0}}},
           {{"format", "pt"}, {"producer", "shardkit"}});
  const float one = 1.0f;
  w.write("scalar", 0, std::as_bytes(std::span<const float>(&one, 1)));
  const uint16_t w_data[6] = {1, 2, 3, 4, 5, 6};
  w.write("w", 0, std::as_bytes(std::span<const uint16_t>(w_data, 6)).subspan(0, 4));
  w.write("w", 4, std::as_bytes(std::span<const uint16_t>(w_data, 6)).subspan(4));
  w.finish();
  w.finish();  // a second call does nothing

  const Reader r(file);
  const Header& h = r.header();
  EXPECT_EQ(h.metadata, (std::map<std::string, std::string>{{"format", "pt"}, {"producer", "shardkit"}}));
  ASSERT_EQ(h.tensors.size(), 3u);
  const TensorInfo* scalar = h.find("scalar");
  ASSERT_NE(scalar, nullptr);
  EXPECT_TRUE(scalar->shape.empty());
  EXPECT_EQ(scalar->dtype, "F32");
  float back = 0;
  r.read(*scalar, 0, std::as_writable_bytes(std::span<float>(&back, 1)));
  EXPECT_EQ(back, 1.0f);
  const TensorInfo* wt = h.find("w");
  ASSERT_NE(wt, nullptr);
  EXPECT_EQ(wt->shape, (std::vector<int64_t>{2, 3}));
  uint16_t w_back[6] = {};
  r.read(*wt, 0, std::as_writable_bytes(std::span<uint16_t>(w_back, 6)));
  EXPECT_EQ(std::memcmp(w_back, w_data, sizeof(w_data)), 0);
  EXPECT_EQ(h.find("none")->size(), 0u);
  EXPECT_EQ(h.find("none")->shape, (std::vector<int64_t>{4, 0}));
}

TEST(SafetensorsWriter, AnUnfinishedFileIsNotAValidFile) {
  ScratchDir dir;
  const fs::path file = dir / "m.safetensors";
  {
    Writer w(file, {{"a", "U8", {4}}}, {});
    w.write("a", 0, as_bytes(std::string("abcd")));
    EXPECT_EQ(fs::file_size(file), w.file_size());  // sized up front
  }                                                 // destroyed without finish(): as after a crash
  expect_error([&] { Reader r(file); }, ErrorKind::kCorrupt, file.string(), "not valid JSON");
}

TEST(SafetensorsWriter, RejectsInvalidSpecsWithoutCreatingTheFile) {
  ScratchDir dir;
  const fs::path file = dir / "m.safetensors";
  const std::string where = file.string();
  using Specs = std::vector<TensorSpec>;
  Specs eight_exabytes;  // 8 * 2^60 bytes: each tensor is valid, their sum is past the largest file offset
  for (const char* name : {"a", "b", "c", "d", "e", "f", "g", "h"})
    eight_exabytes.push_back({name, "U8", {int64_t{1} << 60}});
  const std::vector<std::pair<Specs, std::string>> cases = {
      {Specs{{"a", "U8", {1}}, {"a", "F32", {1}}}, "tensor 'a' is listed twice"},
      {Specs{{"a", "F33", {1}}}, "tensor 'a': unknown dtype 'F33'"},
      {Specs{{"a", "F32", {2, -1}}}, "tensor 'a': negative dimension -1"},
      {Specs{{"a", "F4", {3}}}, "tensor 'a': 3 elements of 4 bits are not a whole number of bytes"},
      {Specs{{"a", "F32", {int64_t{1} << 62, 4}}}, "tensor 'a': shape has more elements"},
      {Specs{{"", "F32", {1}}}, "empty tensor name"},
      {Specs{{std::string("a\0b", 3), "F32", {1}}}, "contains a NUL byte"},
      {Specs{{"__metadata__", "F32", {1}}}, "cannot be named __metadata__"},
      {Specs{{"bad\xff", "F32", {1}}}, "tensor name is not valid UTF-8"},
      {eight_exabytes, "more bytes than a file can hold"},
  };
  for (const auto& [specs, needle] : cases) {
    SCOPED_TRACE(needle);
    expect_error([&] { Writer w(file, specs, {}); }, ErrorKind::kInvalidInput, where, needle);
    EXPECT_FALSE(fs::exists(file));
  }
  expect_error(
      [&] {
        Writer w(file, {}, {{"k", "\xc3"}});
      },
      ErrorKind::kInvalidInput, where, "metadata value of 'k' is not valid UTF-8");
  expect_error([&] { Writer w(dir / "no/such/dir/m.safetensors", {}, {}); }, ErrorKind::kIo,
               (dir / "no/such/dir/m.safetensors").string(), "cannot open");
}

TEST(SafetensorsWriter, RejectsWritesOutsideATensorAndUnknownNames) {
  ScratchDir dir;
  const fs::path file = dir / "m.safetensors";
  Writer w(file, {{"a", "U8", {4}}}, {});
  const std::string five = "12345";
  expect_error([&] { w.write("a", 0, as_bytes(five)); }, ErrorKind::kInternal, file.string(), "outside tensor 'a'");
  expect_error([&] { w.write("a", 5, {}); }, ErrorKind::kInternal, file.string(), "outside tensor 'a'");
  expect_error([&] { w.write("b", 0, {}); }, ErrorKind::kInternal, file.string(), "no tensor 'b'");
  expect_error([&] { w.data_offset("b"); }, ErrorKind::kInternal, file.string(), "no tensor 'b'");
  expect_error([&] { w.tensor_bytes("b"); }, ErrorKind::kInternal, file.string(), "no tensor 'b'");
  w.write("a", 2, as_bytes(five).subspan(0, 2));  // the last two bytes: fine
  w.finish();
  expect_error([&] { w.write("a", 0, {}); }, ErrorKind::kInternal, file.string(), "after finish()");
}

// ---- Sharding and the index -----------------------------------------------------------------------

std::vector<std::vector<std::string>> names(const std::vector<std::vector<TensorSpec>>& shards) {
  std::vector<std::vector<std::string>> out;
  for (const auto& shard : shards) {
    out.emplace_back();
    for (const TensorSpec& t : shard) out.back().push_back(t.name);
  }
  return out;
}

TEST(SafetensorsShards, SplitsInOrderWhenAddingWouldExceedTheMaximum) {
  // Bytes: a 4, b 8, c 4, d 16, e 12, f 4, g 0.
  const std::vector<TensorSpec> tensors = {{"a", "F32", {1}}, {"b", "F32", {2}},  {"c", "F32", {1}}, {"d", "F32", {4}},
                                           {"e", "F32", {3}}, {"f", "BF16", {2}}, {"g", "F32", {0}}};
  // a+b+c = 16 fits exactly; d alone fills a shard; e+f = 16; g (0 bytes) still fits.
  EXPECT_EQ(names(plan_shards(tensors, 16)),
            (std::vector<std::vector<std::string>>{{"a", "b", "c"}, {"d"}, {"e", "f", "g"}}));
  EXPECT_EQ(names(plan_shards(tensors, 1000)),
            (std::vector<std::vector<std::string>>{{"a", "b", "c", "d", "e", "f", "g"}}));
  EXPECT_TRUE(plan_shards({}, 16).empty());
}

TEST(SafetensorsShards, ATensorLargerThanTheMaximumGoesAloneAndIsListedAtOnce) {
  // As huggingface_hub: the oversized tensor's shard is appended when it is met, before the shard being
  // filled, which is closed later. Bytes: a 4, b 8, big 40, d 8, e 4, f 12.
  const std::vector<TensorSpec> tensors = {{"a", "F32", {1}}, {"b", "F32", {2}}, {"big", "F32", {10}},
                                           {"d", "F32", {2}}, {"e", "F32", {1}}, {"f", "F32", {3}}};
  EXPECT_EQ(names(plan_shards(tensors, 16)),
            (std::vector<std::vector<std::string>>{{"big"}, {"a", "b"}, {"d", "e"}, {"f"}}));
  // Leading big tensors come out in order.
  const std::vector<TensorSpec> bigs = {{"x", "F32", {10}}, {"y", "F32", {10}}, {"z", "F32", {1}}};
  EXPECT_EQ(names(plan_shards(bigs, 16)), (std::vector<std::vector<std::string>>{{"x"}, {"y"}, {"z"}}));
  expect_error(
      [] {
        plan_shards({{"bad", "F99", {1}}}, 16);
      },
      ErrorKind::kInvalidInput, "tensor 'bad'", "unknown dtype");
}

TEST(SafetensorsShards, FileNames) {
  EXPECT_EQ(shard_file_name(1, 3), "model-00001-of-00003.safetensors");
  EXPECT_EQ(shard_file_name(3, 3), "model-00003-of-00003.safetensors");
  EXPECT_EQ(shard_file_name(12, 123456), "model-00012-of-123456.safetensors");
  EXPECT_THROW(shard_file_name(0, 3), Error);
  EXPECT_THROW(shard_file_name(4, 3), Error);
  EXPECT_THROW(shard_file_name(1, 0), Error);
}

TEST(SafetensorsShards, IndexJsonMatchesPythonsJsonDumps) {
  // Expected text produced by Python 3: json.dumps(index, indent=2, sort_keys=True) + "\n".
  const std::map<std::string, std::string> weight_map = {
      {"transformer.wte.weight", "model-00001-of-00002.safetensors"},
      {"lm_head.weight", "model-00002-of-00002.safetensors"},
      {"transformer.h.0.attn.bias", "model-00001-of-00002.safetensors"},
      {"caf\xc3\xa9", "model-00002-of-00002.safetensors"},
      {"smile\xf0\x9f\x98\x80", "model-00001-of-00002.safetensors"},
      {"Z\"q\\n\n", "model-00001-of-00002.safetensors"},
  };
  const std::string expected = R"({
  "metadata": {
    "total_size": 1234
  },
  "weight_map": {
    "Z\"q\\n\n": "model-00001-of-00002.safetensors",
    "caf\u00e9": "model-00002-of-00002.safetensors",
    "lm_head.weight": "model-00002-of-00002.safetensors",
    "smile\ud83d\ude00": "model-00001-of-00002.safetensors",
    "transformer.h.0.attn.bias": "model-00001-of-00002.safetensors",
    "transformer.wte.weight": "model-00001-of-00002.safetensors"
  }
}
)";
  EXPECT_EQ(index_json(1234, weight_map), expected);
  EXPECT_EQ(index_json(0, {}), "{\n  \"metadata\": {\n    \"total_size\": 0\n  },\n  \"weight_map\": {}\n}\n");
  EXPECT_EQ(
      index_json(1, {{"del\x7f", "f"}}),
      "{\n  \"metadata\": {\n    \"total_size\": 1\n  },\n  \"weight_map\": {\n    \"del\\u007f\": \"f\"\n  }\n}\n");
  EXPECT_THROW(index_json(1, {{"bad\xff", "f"}}), Error);
}

TEST(SafetensorsShards, TensorBytes) {
  EXPECT_EQ(tensor_bytes({"a", "F32", {2, 3}}), 24u);
  EXPECT_EQ(tensor_bytes({"a", "BF16", {}}), 2u);
  EXPECT_EQ(tensor_bytes({"a", "F4", {6}}), 3u);
  EXPECT_EQ(tensor_bytes({"a", "C64", {0, 5}}), 0u);
  EXPECT_THROW(tensor_bytes({"a", "F4", {5}}), Error);
}

}  // namespace
}  // namespace shardkit::ckpt::safetensors
