// Where shardkit creates, replaces and removes files. Run folders and checkpoints may come from
// someone else, so what lies inside them is not trusted: a symbolic link, FIFO or device where
// shardkit writes or deletes is refused (or, when cleaning up, left alone), never followed. The folder
// the user named is taken as given. An output never overlaps the input it is made from, so that
// writing it, or replacing it with --force, cannot touch that input.
#pragma once

#include <fcntl.h>

#include <filesystem>

#include "base/file_util.hpp"

namespace shardkit {

// Whether `path` is a directory itself (a symbolic link to one is not).
bool is_real_directory(const std::filesystem::path& path) noexcept;

// Creates `dir` (and missing parents) if needed; `dir` must then be a directory itself, not a
// symbolic link to one. Error(kInvalidInput) naming it otherwise.
void make_real_directory(const std::filesystem::path& dir);

// A new, empty regular file at `path`, opened with `flags` (an access mode): a leftover entry there
// (a temporary file of a killed run, a symbolic link, a FIFO) is unlinked first, never followed.
// Error(kInvalidInput) when `path` is a directory.
FileDescriptor create_fresh_file(const std::filesystem::path& path, int flags = O_WRONLY);

// open(2) of `path` with `flags` (O_CREAT allowed), refusing a symbolic link, anything but a regular
// file (a FIFO is never waited on) and a file with other hard links: writing to any of them would
// change something outside the folder. Error(kInvalidInput) naming it.
FileDescriptor open_own_file(const std::filesystem::path& path, int flags);

// Error(kInvalidInput) when `output` is `input`, lies inside it or contains it, after resolving
// symbolic links and `..` (an existing output that is a hard link to the input counts as the input).
void refuse_overlap(const std::filesystem::path& input, const std::filesystem::path& output);

}  // namespace shardkit
