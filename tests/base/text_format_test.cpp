// escape_control: what a terminal would act on is shown as \xNN, everything printable is kept;
// parse_size reads the sizes people write.
#include "base/text_format.hpp"

#include <gtest/gtest.h>

#include <string>

#include "base/error.hpp"
#include "report/html_report.hpp"

namespace shardkit::ckpt {
namespace {

TEST(ParseSize, ReadsDecimalAndBinaryUnitsAndRefusesTheRest) {
  EXPECT_EQ(parse_size("4096", "--size"), 4096);
  EXPECT_EQ(parse_size("5GB", "--size"), 5'000'000'000);
  EXPECT_EQ(parse_size("1.5g", "--size"), 1'500'000'000);
  EXPECT_EQ(parse_size("512MiB", "--size"), int64_t{512} << 20);
  EXPECT_EQ(parse_size("256GiB", "--size"), int64_t{256} << 30);
  for (const char* bad : {"", "GiB", "12 parsecs", "-1GB", "1e30TB", "nan"}) {
    EXPECT_THROW(parse_size(bad, "--size"), Error) << bad;
  }
}

TEST(EscapeControl, KeepsPrintableTextAndValidUtf8) {
  EXPECT_EQ(escape_control("step-00000004/shard-00001-of-00002.h5: OK"), "step-00000004/shard-00001-of-00002.h5: OK");
  EXPECT_EQ(escape_control("Gewichte \xc3\xa4 \xe6\x9d\x83\xe9\x87\x8d \xf0\x9f\x98\x80"),
            "Gewichte \xc3\xa4 \xe6\x9d\x83\xe9\x87\x8d \xf0\x9f\x98\x80");
  EXPECT_EQ(escape_control(""), "");
}

TEST(EscapeControl, EscapesC0ControlsAndDel) {
  EXPECT_EQ(escape_control("a\033[32mOK\r\n\t\x7f"), "a\\x1b[32mOK\\x0d\\x0a\\x09\\x7f");
  EXPECT_EQ(escape_control(std::string("nul\0byte", 8)), "nul\\x00byte");
}

TEST(EscapeControl, EscapesC1ControlsBidiOverridesAndLineSeparators) {
  EXPECT_EQ(escape_control("\xc2\x9b"
                           "31m"),
            "\\xc2\\x9b31m");                                                                 // U+009B, a CSI
  EXPECT_EQ(escape_control("a\xe2\x80\xaegnp.exe"), "a\\xe2\\x80\\xaegnp.exe");               // U+202E
  EXPECT_EQ(escape_control("x\xe2\x80\xa8y"), "x\\xe2\\x80\\xa8y");                           // U+2028
  EXPECT_EQ(escape_control("\xe2\x81\xa6z\xe2\x81\xa9"), "\\xe2\\x81\\xa6z\\xe2\\x81\\xa9");  // U+2066, U+2069
  EXPECT_EQ(escape_control("\xc2\xa0"), "\xc2\xa0") << "U+00A0 is printable";
}

TEST(EscapeControl, EscapesEveryByteThatIsNotUtf8) {
  EXPECT_EQ(escape_control("\x9b"
                           "31m"),
            "\\x9b31m")
      << "a raw C1 byte";
  EXPECT_EQ(escape_control("\xff\xfe"), "\\xff\\xfe");
  EXPECT_EQ(escape_control("\xc3"), "\\xc3") << "cut short";
  EXPECT_EQ(escape_control("\xc0\xaf"), "\\xc0\\xaf") << "overlong '/'";
  EXPECT_EQ(escape_control("\xe0\x80\xaf"), "\\xe0\\x80\\xaf") << "overlong, 3 bytes";
  EXPECT_EQ(escape_control("\xed\xa0\x80"), "\\xed\\xa0\\x80") << "a surrogate";
  EXPECT_EQ(escape_control("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80") << "past U+10FFFF";
  EXPECT_EQ(escape_control("\xe6\x9d"
                           "a"),
            "\\xe6\\x9da")
      << "a lead byte followed by ASCII";
}

TEST(EscapeControl, HtmlEscapingEscapesControlsToo) {
  EXPECT_EQ(report::html_escape("<b>\033[31m&\"'</b>"), "&lt;b&gt;\\x1b[31m&amp;&quot;&#39;&lt;/b&gt;");
}

}  // namespace
}  // namespace shardkit::ckpt
