#include "base/write_target.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <string>

#include "base/error.hpp"

namespace shardkit {
namespace {

// The path with symbolic links and `..` resolved as far as it exists, without a trailing separator.
std::filesystem::path resolved(const std::filesystem::path& path) {
  std::error_code ec;
  std::filesystem::path out = std::filesystem::weakly_canonical(std::filesystem::absolute(path), ec);
  if (ec) out = std::filesystem::absolute(path).lexically_normal();
  if (out.filename().empty() && out.has_parent_path() && out != out.root_path()) out = out.parent_path();
  return out;
}

bool is_within(const std::filesystem::path& inner, const std::filesystem::path& outer) {
  const auto [o, i] = std::mismatch(outer.begin(), outer.end(), inner.begin(), inner.end());
  return o == outer.end();
}

}  // namespace

bool is_real_directory(const std::filesystem::path& path) noexcept {
  std::error_code ec;
  return std::filesystem::symlink_status(path, ec).type() == std::filesystem::file_type::directory;
}

void make_real_directory(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  std::error_code status_ec;
  const std::filesystem::file_type type = std::filesystem::symlink_status(dir, status_ec).type();
  if (type == std::filesystem::file_type::directory) return;
  if (ec && type == std::filesystem::file_type::not_found) {
    fail(ErrorKind::kIo, dir.string() + ": cannot create directory: " + ec.message());
  }
  fail(ErrorKind::kInvalidInput,
       dir.string() + ": " + (type == std::filesystem::file_type::symlink ? "a symbolic link" : "not a directory") +
           " (expected a directory of its own; shardkit does not write through links)");
}

FileDescriptor create_fresh_file(const std::filesystem::path& path, int flags) {
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::symlink_status(path, ec);
  if (st.type() == std::filesystem::file_type::directory) {
    fail(ErrorKind::kInvalidInput, path.string() + ": a directory (expected no entry or a leftover file to replace)");
  }
  if (std::filesystem::exists(st)) {
    std::filesystem::remove(path, ec);
    if (ec) fail(ErrorKind::kIo, path.string() + ": cannot remove the leftover entry: " + ec.message());
  }
  // O_EXCL with O_NOFOLLOW: an entry that appears meanwhile is an error, never a file written through.
  return FileDescriptor(path, flags | O_CREAT | O_EXCL | O_NOFOLLOW);
}

FileDescriptor open_own_file(const std::filesystem::path& path, int flags) {
  const auto refuse = [&](const std::string& what) {
    fail(ErrorKind::kInvalidInput, path.string() + ": " + what + " (expected a regular file of its own)");
  };
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::symlink_status(path, ec);
  if (std::filesystem::is_symlink(status)) refuse("a symbolic link");
  // Checked before open(2) too: opening a device can have effects of its own.
  if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) refuse("not a regular file");
  FileDescriptor fd(path, flags | O_NOFOLLOW | O_NONBLOCK);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) fail_errno(path.string() + ": fstat", errno);
  if (!S_ISREG(st.st_mode)) refuse("not a regular file");
  if (st.st_nlink > 1) refuse("a file with " + std::to_string(st.st_nlink) + " hard links");
  return fd;
}

void refuse_overlap(const std::filesystem::path& input, const std::filesystem::path& output) {
  const std::filesystem::path in = resolved(input);
  const std::filesystem::path out = resolved(output);
  std::error_code ec;
  const bool same = in == out || std::filesystem::equivalent(input, output, ec);
  const auto refuse = [&](const std::string& relation) {
    fail(ErrorKind::kInvalidInput, output.string() + ": " + relation + " " + input.string() +
                                       "; an output may not overlap its input (choose another output)");
  };
  if (same) refuse("is the input");
  if (is_within(out, in)) refuse("lies inside the input");
  if (is_within(in, out)) refuse("contains the input");
}

}  // namespace shardkit
