// What a user learns from the binary itself: every command's --help (found by walking the command tree
// from `shardkit --help`, so that a new command is checked without being listed here), and the progress
// reports of long commands on stderr: plain lines in a log, a bar on a terminal, nothing with --quiet.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cli/cli_support.hpp"
#include "tests/support/test_support.hpp"

namespace shardkit {
namespace {

using namespace testing::cli;

// Commands that must exist, whatever else the discovery finds.
const std::set<std::string> kKnownLeaves = {"train",
                                            "eval",
                                            "data encode",
                                            "convert reshard",
                                            "convert consolidate",
                                            "convert import",
                                            "convert import-deepspeed",
                                            "convert export-deepspeed",
                                            "ckpt ls",
                                            "ckpt inspect",
                                            "ckpt verify",
                                            "ckpt diff",
                                            "bench ckpt",
                                            "bench checksum"};
const std::set<std::string> kKnownGroups = {"", "data", "convert", "ckpt", "bench"};
// Commands that report progress, and so take -q/--quiet.
const std::vector<std::string> kProgressCommands = {"eval",
                                                    "data encode",
                                                    "convert reshard",
                                                    "convert consolidate",
                                                    "convert import",
                                                    "convert import-deepspeed",
                                                    "convert export-deepspeed",
                                                    "ckpt verify",
                                                    "ckpt diff",
                                                    "bench ckpt",
                                                    "bench checksum"};

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

std::string trim(const std::string& s) {
  const size_t begin = s.find_first_not_of(' ');
  if (begin == std::string::npos) return {};
  return s.substr(begin, s.find_last_not_of(' ') - begin + 1);
}

// One entry of a CLI11 help section: "  NAME TYPE...  Description", the description possibly on the
// following lines (indented to the same column) when the name is long or the text has several lines.
struct Entry {
  std::string name;  // "-o,--output TEXT REQUIRED"
  std::string description;
};

std::vector<Entry> section(const std::string& help, const std::string& title) {
  std::vector<Entry> entries;
  bool inside = false;
  for (const std::string& line : lines_of(help)) {
    if (!inside) {
      inside = line == title + ":";
      continue;
    }
    if (trim(line).empty()) break;
    if (line.rfind("   ", 0) == 0) {  // a continuation of the entry above
      if (!entries.empty()) entries.back().description.append(" ").append(trim(line));
      continue;
    }
    // CLI11 pads a name to column 30 and starts the description there, or on the next line when the
    // name is longer.
    constexpr size_t kColumn = 30;
    const bool same_line = line.size() > kColumn && line[kColumn - 1] == ' ';
    entries.push_back({trim(line.substr(0, same_line ? kColumn : line.size())),
                       same_line ? trim(line.substr(kColumn)) : std::string()});
  }
  return entries;
}

// The option names of an entry: "-o,--output TEXT REQUIRED" -> {"-o", "--output"}.
std::vector<std::string> option_names(const Entry& e) {
  std::vector<std::string> names;
  std::istringstream in(e.name.substr(0, e.name.find(' ')));
  for (std::string name; std::getline(in, name, ',');) names.push_back(name);
  return names;
}

// The footer's "Example:" command, continuation lines (ending in '\') joined; empty if none.
std::string example_of(const std::string& help) {
  const std::string kPrefix = "Example: ";
  std::string example;
  bool continued = false;
  for (const std::string& line : lines_of(help)) {
    if (!continued && line.rfind(kPrefix, 0) != 0) continue;
    example.append(" ").append(trim(continued ? line : line.substr(kPrefix.size())));
    continued = example.back() == '\\';
    if (continued) example.pop_back();
    if (!continued) break;
  }
  return trim(example);
}

// Splits a shell command line into words ("..." quotes one word).
std::vector<std::string> words_of(const std::string& command) {
  std::vector<std::string> words;
  std::string word;
  bool quoted = false, any = false;
  for (const char c : command) {
    if (c == '"') {
      quoted = !quoted;
      any = true;
    } else if (c == ' ' && !quoted) {
      if (any) words.push_back(word);
      word.clear();
      any = false;
    } else {
      word += c;
      any = true;
    }
  }
  if (any) words.push_back(word);
  return words;
}

struct Command {
  std::string path;  // "ckpt verify"; "" is the top level
  Result help;
};

// Walks the command tree from `shardkit --help`: a command whose help lists subcommands is a group.
void discover(const std::string& path, std::vector<Command>& groups, std::vector<Command>& leaves) {
  Command c{path, run(path + " --help")};
  const std::vector<Entry> subcommands = section(c.help.out, "Subcommands");
  if (subcommands.empty()) {
    leaves.push_back(std::move(c));
    return;
  }
  groups.push_back(c);
  for (const Entry& sub : subcommands) discover(path.empty() ? sub.name : path + " " + sub.name, groups, leaves);
}

struct Tree {
  std::vector<Command> groups;
  std::vector<Command> leaves;
};

const Tree& tree() {
  static const Tree t = [] {
    Tree out;
    discover("", out.groups, out.leaves);
    return out;
  }();
  return t;
}

std::set<std::string> paths(const std::vector<Command>& commands) {
  std::set<std::string> out;
  for (const Command& c : commands) out.insert(c.path);
  return out;
}

// A description worth reading: at least two words.
bool useful(const std::string& description) {
  return description.find(' ') != std::string::npos && description.size() >= 8;
}

TEST(Help, DiscoveryFindsEveryKnownCommand) {
  const std::set<std::string> leaves = paths(tree().leaves);
  const std::set<std::string> groups = paths(tree().groups);
  for (const std::string& known : kKnownLeaves) EXPECT_TRUE(leaves.count(known)) << "'" << known << "' not found";
  for (const std::string& known : kKnownGroups) EXPECT_TRUE(groups.count(known)) << "group '" << known << "'";
}

TEST(Help, GroupsListEverySubcommandWithItsPurpose) {
  for (const Command& group : tree().groups) {
    SCOPED_TRACE("shardkit " + group.path + " --help\n" + group.help.out);
    EXPECT_EQ(group.help.code, 0);
    EXPECT_TRUE(group.help.err.empty()) << group.help.err;
    for (const Entry& sub : section(group.help.out, "Subcommands")) {
      EXPECT_TRUE(useful(sub.description)) << sub.name << ": '" << sub.description << "'";
    }
    // Each group says how to learn more about its commands.
    EXPECT_NE(group.help.out.find("COMMAND --help"), std::string::npos);
  }
}

TEST(Help, TopLevelPointsAtAFirstCommand) {
  const Result r = run("--help");
  ASSERT_EQ(r.code, 0);
  EXPECT_TRUE(std::regex_search(r.out, std::regex("\nStart with: shardkit [a-z]"))) << r.out;
  EXPECT_NE(r.out.find("ZeRO"), std::string::npos) << r.out;  // what the tool is for
}

TEST(Help, EveryCommandHasAPurposeDescribedOptionsAndARealExample) {
  ASSERT_GE(tree().leaves.size(), kKnownLeaves.size());
  for (const Command& leaf : tree().leaves) {
    SCOPED_TRACE("shardkit " + leaf.path + " --help\n" + leaf.help.out);
    EXPECT_EQ(leaf.help.code, 0);
    EXPECT_TRUE(leaf.help.err.empty()) << leaf.help.err;
    // CLI11 prints the command's description first, then the usage line.
    const std::vector<std::string> lines = lines_of(leaf.help.out);
    ASSERT_GE(lines.size(), 2u);
    EXPECT_TRUE(useful(lines[0]) && lines[0].rfind("Usage:", 0) != 0) << "no purpose line: '" << lines[0] << "'";
    EXPECT_EQ(lines[1].rfind("Usage: shardkit " + leaf.path, 0), 0u) << lines[1];

    std::vector<Entry> entries = section(leaf.help.out, "Options");
    EXPECT_FALSE(entries.empty());
    std::set<std::string> options;
    for (const Entry& e : entries) {
      for (const std::string& name : option_names(e)) options.insert(name);
    }
    for (const Entry& e : section(leaf.help.out, "Positionals")) entries.push_back(e);
    for (const Entry& e : entries) EXPECT_TRUE(useful(e.description)) << e.name << ": '" << e.description << "'";

    // The example runs this command (under mpirun or not) with options it has.
    const std::vector<std::string> words = words_of(example_of(leaf.help.out));
    ASSERT_FALSE(words.empty()) << "no 'Example: ' line";
    EXPECT_TRUE(words[0] == "shardkit" || words[0] == "mpirun") << words[0];
    const auto binary = std::find(words.begin(), words.end(), "shardkit");
    ASSERT_NE(binary, words.end());
    const std::vector<std::string> path = words_of(leaf.path);
    ASSERT_GE(static_cast<size_t>(words.end() - binary), path.size() + 1);
    EXPECT_TRUE(std::equal(path.begin(), path.end(), binary + 1)) << "the example runs another command";
    for (auto w = binary + 1 + static_cast<std::ptrdiff_t>(path.size()); w != words.end(); ++w) {
      if (w->size() < 2 || (*w)[0] != '-' || std::isdigit(static_cast<unsigned char>((*w)[1]))) continue;
      EXPECT_TRUE(options.count(w->substr(0, w->find('=')))) << "the example uses an unknown option " << *w;
    }
  }
}

TEST(Help, EveryCommandThatReportsProgressTakesQuiet) {
  const std::set<std::string> leaves = paths(tree().leaves);
  for (const std::string& path : kProgressCommands) {
    ASSERT_TRUE(leaves.count(path)) << path;
    const Result r = run(path + " --help");
    bool quiet = false;
    for (const Entry& e : section(r.out, "Options")) quiet = quiet || e.name.rfind("-q,--quiet", 0) == 0;
    EXPECT_TRUE(quiet) << path << " has no -q,--quiet\n" << r.out;
  }
  // train reports its steps instead of a bar; it takes --quiet too.
  EXPECT_NE(run("train --help").out.find("-q,--quiet"), std::string::npos);
}

// The progress lines of `label` in a command's stderr: "label: NN%  ...".
std::vector<std::string> progress_lines(const std::string& err, const std::string& label) {
  std::vector<std::string> out;
  const std::regex line("^" + label + ": +[0-9]+%  .*");
  for (const std::string& l : lines_of(err)) {
    if (std::regex_match(l, line)) out.push_back(l);
  }
  return out;
}

// Runs `args` with output to files (not a terminal) with a line at every update, then with --quiet:
// the first prints plain progress lines on stderr ending with a final one, the second nothing.
void expect_plain_progress(const std::string& label, const std::string& args, const std::string& prefix = "") {
  SCOPED_TRACE("shardkit " + args);
  const Result r = run(args, prefix, "SHARDKIT_PROGRESS_INTERVAL=0");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::vector<std::string> lines = progress_lines(r.err, label);
  ASSERT_GE(lines.size(), 2u) << "expected progress lines and a final one:\n" << r.err;
  EXPECT_NE(lines.back().find("100%"), std::string::npos) << lines.back();
  EXPECT_NE(lines.back().find(" in "), std::string::npos) << "no final line: " << lines.back();
  EXPECT_EQ(r.err.find('\r'), std::string::npos) << "a bar drawn into a file";
  EXPECT_TRUE(progress_lines(r.out, label).empty()) << "progress on stdout";

  const Result quiet = run(args + " --quiet", prefix, "SHARDKIT_PROGRESS_INTERVAL=0");
  ASSERT_EQ(quiet.code, 0) << quiet.err;
  EXPECT_EQ(quiet.err, "") << "--quiet still reports";
  EXPECT_EQ(quiet.out.empty(), r.out.empty()) << "--quiet must not hide the result";
}

TEST(Progress, LongCommandsPrintPlainLinesInALogAndNothingWhenQuiet) {
  testing::TempDir dir;
  const std::string d = dir.path().string();

  // 40 MiB of text: three blocks of data encode.
  {
    std::ofstream text(dir / "big.txt");
    const std::string line(1023, 'x');
    for (int i = 0; i < 40 * 1024; ++i) text << line << '\n';
  }
  expect_plain_progress("encode", "data encode " + d + "/big.txt -o " + d + "/big.bin");

  const std::string tokens = write_text_tokens(dir).string();
  ASSERT_EQ(run("train --config " + samples() + "tiny_zero2.json --model gpt2-tiny --data " + tokens +
                " --steps 1 --threads 1 --quiet --save-dir " + d + "/tiny")
                .code,
            0);
  expect_plain_progress("eval", "eval " + d + "/tiny --data " + tokens + " --windows 64 --threads 1");
  expect_plain_progress("consolidate", "convert consolidate " + d + "/tiny --force -o " + d + "/export");
  expect_plain_progress("import", "convert import " + d + "/export --force -o " + d + "/imported --world-size 2");

  expect_plain_progress("bench checksum", "bench checksum --size 4MiB");
  expect_plain_progress("bench ckpt", "bench ckpt --size 8MiB --repeat 3 --no-fsync --dir " + d + "/bench");
  expect_plain_progress("verify", "ckpt verify " + d + "/bench");
  expect_plain_progress("reshard", "convert reshard " + d + "/bench --force -o " + d + "/bench-3 --world-size 3");
  expect_plain_progress("diff", "ckpt diff " + d + "/bench " + d + "/bench-3");
}

TEST(Progress, OnlyRankZeroReports) {
  testing::TempDir dir;
  const Result r = run("bench ckpt --size 4MiB --repeat 3 --no-fsync --dir " + dir.path().string(), mpirun(2),
                       "SHARDKIT_PROGRESS_INTERVAL=0");
  ASSERT_EQ(r.code, 0) << r.err;
  // After the first and second checkpoint, and the final line: once, not once per rank.
  EXPECT_EQ(progress_lines(r.err, "bench ckpt").size(), 3u) << r.err;
}

TEST(Progress, ALogGetsNoLineBeforeTheInterval) {
  // The default interval is seconds: a short job leaves no trace.
  Result r = run("bench checksum --size 4MiB");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  r = run("bench checksum --size 4MiB", "", "SHARDKIT_PROGRESS_INTERVAL=3600");
  EXPECT_EQ(r.err, "");
  r = run("bench checksum --size 4MiB", "", "SHARDKIT_PROGRESS_INTERVAL=soon");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("SHARDKIT_PROGRESS_INTERVAL"), std::string::npos) << r.err;
}

TEST(Progress, ATerminalGetsABarRedrawnInPlace) {
  if (std::system("command -v script >/dev/null 2>&1") != 0) GTEST_SKIP() << "needs script(1) for a terminal";
  testing::TempDir dir;
  // script(1) runs the command on a pseudo-terminal and copies what it prints into the file.
  const auto on_terminal = [&](const std::string& args) {
    const std::string command = std::string("script -qec '") + SHARDKIT_BINARY + " " + args + "' /dev/null > " +
                                (dir / "tty").string() + " 2>&1 </dev/null";
    EXPECT_EQ(std::system(command.c_str()), 0) << command;
    return slurp(dir / "tty");
  };
  const std::string bar = on_terminal("bench checksum --size 4MiB");
  EXPECT_NE(bar.find("\rbench checksum ["), std::string::npos) << bar;
  EXPECT_NE(bar.find("100%"), std::string::npos) << bar;
  EXPECT_NE(bar.find("\033[K"), std::string::npos) << bar;  // clears the rest of the line it redraws
  const std::string quiet = on_terminal("bench checksum --size 4MiB --quiet");
  EXPECT_EQ(quiet.find("bench checksum ["), std::string::npos) << quiet;
  EXPECT_NE(quiet.find("xxh64"), std::string::npos) << quiet;  // the result still comes
}

}  // namespace
}  // namespace shardkit
