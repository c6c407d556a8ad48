#include "ckpt/tensor_table.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "base/error.hpp"

namespace shardkit::ckpt {
namespace {

TEST(TensorTable, PlainNamesOnly) {
  EXPECT_TRUE(is_plain_name("transformer.h.0.attn.c_attn.weight"));
  EXPECT_TRUE(is_plain_name("a-b_c"));
  for (const char* bad : {"", "../x", "a/b", "/abs", ".hidden", "a..b", "-option", "a b", "a\\b", "ü"}) {
    EXPECT_FALSE(is_plain_name(bad)) << bad;
  }
  EXPECT_FALSE(is_plain_name(std::string(513, 'a')));
}

TEST(TensorTable, RejectsDuplicatesBadNamesAndShapes) {
  EXPECT_THROW(TensorTable({{"a", {1}, DType::kF32}, {"a", {2}, DType::kF32}}), Error);
  EXPECT_THROW(TensorTable({{"../etc/passwd", {1}, DType::kF32}}), Error);
  EXPECT_THROW(TensorTable({{"a", {-1}, DType::kF32}}), Error);
  EXPECT_THROW(TensorTable({{"a", {int64_t{1} << 40, int64_t{1} << 40}, DType::kF32}}), Error);  // overflow
  EXPECT_THROW(TensorTable({{"a", {1, 1, 1, 1, 1, 1, 1, 1, 1}, DType::kF32}}), Error);
}

TEST(TensorTable, JsonRoundTripAndFindByName) {
  const TensorTable table({{"w", {2, 3}, DType::kBF16}, {"b", {3}, DType::kF32}, {"s", {}, DType::kF16}});
  const TensorTable back = tensor_table_from_json(tensor_table_to_json(table), "test");
  EXPECT_EQ(back, table);
  EXPECT_EQ(back.find("b"), 1);
  EXPECT_EQ(back.find("missing"), -1);
  EXPECT_EQ(back.total_elements(), 10);
  EXPECT_EQ(back[2].numel(), 1);
}

TEST(TensorTable, JsonErrorsNameTheSource) {
  const auto parse = [](const char* text) { return tensor_table_from_json(nlohmann::json::parse(text), "m.json"); };
  for (const char* bad :
       {R"({"a":1})", R"([{"name":"a","shape":[1]}])", R"([{"name":"a","shape":[1.5],"dtype":"f32"}])",
        R"([{"name":"a","shape":[1],"dtype":"int4"}])", R"([{"name":"a/b","shape":[1],"dtype":"f32"}])",
        R"([{"name":"a","shape":[18446744073709551615],"dtype":"f32"}])"}) {
    try {
      parse(bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
      EXPECT_NE(std::string(e.what()).find("m.json"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace shardkit::ckpt
