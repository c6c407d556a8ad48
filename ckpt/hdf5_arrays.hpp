// A plain HDF5 file of named fp32 arrays with attributes, for exports that other tools read (h5py,
// h5dump): the consolidated weights. The HDF5 library stays behind this interface.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>

namespace shardkit::ckpt {

class Hdf5ArrayFile {
 public:
  // Creates (truncating) `path`; errors name it.
  explicit Hdf5ArrayFile(const std::filesystem::path& path);
  ~Hdf5ArrayFile();
  Hdf5ArrayFile(const Hdf5ArrayFile&) = delete;
  Hdf5ArrayFile& operator=(const Hdf5ArrayFile&) = delete;

  void attribute(const char* name, const std::string& value);
  void attribute(const char* name, int64_t value);

  // Creates the fp32 dataset `name` (an absolute path; missing groups are created) of shape `dims`
  // (none: a scalar); it is the one write_rows() writes until the next create().
  void create(const std::string& name, std::span<const int64_t> dims);
  // Writes `rows` whole rows along the first dimension from `first_row` on, row-major (a scalar: its
  // one value, first_row 0, rows 1).
  void write_rows(int64_t first_row, int64_t rows, std::span<const float> values);

  // Closes the file, flushing HDF5's metadata (errors reported, unlike in the destructor).
  void close();

 private:
  struct Handles;
  std::unique_ptr<Handles> h5_;
  std::string where_;
};

}  // namespace shardkit::ckpt
