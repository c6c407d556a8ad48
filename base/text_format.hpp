// Text written for people: byte sizes and counts with thousands separators, and strings from inputs
// made safe to print. Shared by the command line's console output and the HTML report, so that both
// print the same figure the same way.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace shardkit {

// 1234567 -> "1.23 MB" (decimal units, two decimals past bytes).
std::string format_bytes(double bytes);
// 1234567 -> "1,234,567".
std::string format_count(int64_t value);
// "1GiB", "512MiB", "5GB", "1.5G", "4096" -> bytes. Error(kInvalidInput) naming `option` (the flag or
// variable it came from) otherwise.
int64_t parse_size(std::string_view text, std::string_view option);

// Text that may come from an input (a name in a manifest, a file name, a message quoting either) as
// it may reach a terminal or a log: every byte that could move the cursor, change colours, end the
// line or reorder what follows is written as \xNN. That is C0 controls (newline and ESC included),
// DEL, C1 controls, Unicode's line and paragraph separators and bidirectional controls (all of their
// bytes), and any byte that is not part of valid UTF-8. Printable UTF-8 is kept as it is.
std::string escape_control(std::string_view text);

// Every line shardkit prints for people goes through here: the printf-style `format` and its
// arguments, escaped whole as above (so no message can forget an input it quotes), then '\n'. Colours
// or cursor moves of shardkit's own are written around it, never through it.
void print_line(std::FILE* to, const char* format, ...) __attribute__((format(printf, 2, 3)));

}  // namespace shardkit
