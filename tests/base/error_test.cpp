// Errors passed between ranks as text keep their kind (and with it the exit code), and a garbled text
// is an internal error, not whatever its first character says.
#include <gtest/gtest.h>

#include <stdexcept>

#include "base/error.hpp"

namespace shardkit {
namespace {

ErrorKind kind_thrown_by(const std::string& text, std::string* message) {
  try {
    throw_if_error_text(text);
  } catch (const Error& e) {
    *message = e.what();
    return e.kind();
  }
  ADD_FAILURE() << "no error thrown for \"" << text << "\"";
  return ErrorKind::kInternal;
}

TEST(ErrorText, KeepsTheKindAndTheMessageAcrossTheTrip) {
  for (const ErrorKind kind : {ErrorKind::kInvalidInput, ErrorKind::kCorrupt, ErrorKind::kIo, ErrorKind::kInternal}) {
    std::string message;
    EXPECT_EQ(kind_thrown_by(error_to_text(Error(kind, "run: cannot create directory")), &message), kind);
    EXPECT_EQ(message, "run: cannot create directory");
  }
  std::string message;
  EXPECT_EQ(kind_thrown_by(error_to_text(std::runtime_error("bad_alloc")), &message), ErrorKind::kInternal);
  EXPECT_EQ(message, "bad_alloc");
  EXPECT_NO_THROW(throw_if_error_text(""));
}

TEST(ErrorText, AGarbledTextIsAnInternalErrorThatQuotesIt) {
  for (const std::string text : {"x", "9 nine", "2nospace", "-1 minus"}) {
    std::string message;
    EXPECT_EQ(kind_thrown_by(text, &message), ErrorKind::kInternal) << text;
    EXPECT_NE(message.find(text), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace shardkit
