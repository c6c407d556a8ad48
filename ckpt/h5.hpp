// Thin RAII layer over the HDF5 C API. Every HDF5 id is owned by an h5::Id; every call that can
// fail goes through a wrapper that turns HDF5's error stack into an Error naming the file and what
// was being done. HDF5's own error printing is silenced. Only ckpt's HDF5 module includes this header
// (h5, hdf5_arrays, the shard writer, reader and index, the virtual view; and the tests that craft
// shards): no header outside it reaches <hdf5.h>.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "base/error.hpp"

namespace shardkit::ckpt::h5 {

// Silences HDF5's error printing on the calling thread (HDF5 keeps one error stack per thread),
// registers the zstd filter (32015) in the process and switches off HDF5's loading of filter plugins
// from HDF5_PLUGIN_PATH (a file naming an unknown filter must not make shardkit load a library), once
// per process. Every wrapper below calls it.
void init_thread();

// Owns one HDF5 id and closes it with the matching H5?close. Destructors never throw; use close()
// where a failure must be reported (closing a file flushes its metadata).
class Id {
 public:
  Id() = default;
  explicit Id(hid_t id) noexcept : id_(id) {}
  ~Id();
  Id(Id&& other) noexcept;
  Id& operator=(Id&& other) noexcept;
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;

  hid_t get() const noexcept { return id_; }
  explicit operator bool() const noexcept { return id_ >= 0; }
  // Closes now; throws Error(kIo) with `context` if HDF5 reports a failure.
  void close(const std::string& context);

 private:
  hid_t id_ = H5I_INVALID_HID;
};

// The messages of HDF5's current error stack on this thread, innermost last, joined by "; ".
std::string error_stack_message();

// Throws Error(kind, context + ": " + HDF5's message) when `status` < 0.
void check(herr_t status, const std::string& context, ErrorKind kind = ErrorKind::kIo);
// Same for a returned id; returns it wrapped.
Id check_id(hid_t id, const std::string& context, ErrorKind kind = ErrorKind::kIo);

// Creates (truncating) a file in the HDF5 1.10 format, whose metadata all carry checksums. With
// `alignment` > 0, every allocation of at least 64 KiB (the raw data chunks) starts at a multiple of it.
Id create_file(const std::filesystem::path& path, int64_t alignment = 0);
// Opens read-only; errors name `where` (by default the path). A file that is not HDF5 is
// Error(kCorrupt) "not an HDF5 file".
Id open_file(const std::filesystem::path& path, const std::string& where = {});

Id create_group(hid_t loc, const char* name, const std::string& where);
bool link_exists(hid_t loc, const char* name);
// The names of the links in `group`, refused (Error(kCorrupt)) unless every one is a hard link (soft
// and external links could lead outside the file). The listing stops after `max_links` + 1 names:
// enough to tell that there are more than expected, without walking a crafted group of millions.
std::vector<std::string> hard_link_names(hid_t group, size_t max_links, const std::string& where);
// Open a group or dataset that must be a hard link of `loc` (Error(kCorrupt) otherwise).
Id open_group(hid_t loc, const char* name, const std::string& where);
Id open_dataset(hid_t loc, const char* name, const std::string& where);
// The filters of a dataset's pipeline, after refusing storage outside the file: external raw data
// files and virtual datasets (Error(kCorrupt)). Call before reading a dataset's values.
std::vector<H5Z_filter_t> checked_storage(hid_t dataset, const std::string& where);

// Attributes: int64 and UTF-8 variable-length strings (h5py returns them as int and str).
void write_attribute(hid_t obj, const char* name, int64_t value, const std::string& where);
void write_attribute(hid_t obj, const char* name, const std::string& value, const std::string& where);
int64_t read_int_attribute(hid_t obj, const char* name, const std::string& where);
std::string read_string_attribute(hid_t obj, const char* name, const std::string& where);

// Small whole datasets: 1-D or 2-D int64/uint64 and 1-D vlen UTF-8 strings, written contiguous.
void write_int64_dataset(hid_t loc, const char* name, const std::vector<hsize_t>& dims, const int64_t* data,
                         const std::string& where);
void write_uint64_dataset(hid_t loc, const char* name, hsize_t n, const uint64_t* data, const std::string& where);
void write_string_dataset(hid_t loc, const char* name, const std::vector<std::string>& values,
                          const std::string& where);
// Reads a dataset of integers whose shape must be `dims`, stored in the file without filters
// (Error(kCorrupt) otherwise).
std::vector<int64_t> read_int64_dataset(hid_t loc, const char* name, const std::vector<hsize_t>& dims,
                                        const std::string& where);
std::vector<uint64_t> read_uint64_dataset(hid_t loc, const char* name, hsize_t n, const std::string& where);
// The dataset's dimensions.
std::vector<hsize_t> dataset_dims(hid_t dataset, const std::string& where);

}  // namespace shardkit::ckpt::h5
