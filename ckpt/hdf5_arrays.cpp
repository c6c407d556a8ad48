#include "ckpt/hdf5_arrays.hpp"

#include <vector>

#include "base/error.hpp"
#include "ckpt/h5.hpp"

namespace shardkit::ckpt {

// In this order so that the dataset closes before the file.
struct Hdf5ArrayFile::Handles {
  h5::Id file;
  h5::Id dataset;
  std::string name;
  std::vector<hsize_t> dims;
};

Hdf5ArrayFile::Hdf5ArrayFile(const std::filesystem::path& path)
    : h5_(std::make_unique<Handles>()), where_(path.string()) {
  h5_->file = h5::create_file(path);
}

Hdf5ArrayFile::~Hdf5ArrayFile() = default;

void Hdf5ArrayFile::attribute(const char* name, const std::string& value) {
  h5::write_attribute(h5_->file.get(), name, value, where_);
}

void Hdf5ArrayFile::attribute(const char* name, int64_t value) {
  h5::write_attribute(h5_->file.get(), name, value, where_);
}

void Hdf5ArrayFile::create(const std::string& name, std::span<const int64_t> dims) {
  h5_->dataset = h5::Id();
  h5_->name = name;
  h5_->dims.assign(dims.begin(), dims.end());
  const std::vector<hsize_t>& d = h5_->dims;
  const h5::Id space =
      h5::check_id(d.empty() ? H5Screate(H5S_SCALAR) : H5Screate_simple(static_cast<int>(d.size()), d.data(), nullptr),
                   where_ + ": dataspace of " + name);
  const h5::Id lcpl = h5::check_id(H5Pcreate(H5P_LINK_CREATE), where_ + ": H5Pcreate");
  h5::check(H5Pset_create_intermediate_group(lcpl.get(), 1), where_ + ": H5Pset_create_intermediate_group");
  h5_->dataset = h5::check_id(
      H5Dcreate2(h5_->file.get(), name.c_str(), H5T_IEEE_F32LE, space.get(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT),
      where_ + ": cannot create " + name);
}

void Hdf5ArrayFile::write_rows(int64_t first_row, int64_t rows, std::span<const float> values) {
  if (!h5_->dataset) fail(ErrorKind::kInternal, where_ + ": write_rows() before create()");
  const std::string& name = h5_->name;
  const h5::Id file_space = h5::check_id(H5Dget_space(h5_->dataset.get()), where_ + ": dataspace of " + name);
  if (!h5_->dims.empty()) {
    std::vector<hsize_t> start(h5_->dims.size(), 0), extent = h5_->dims;
    start[0] = static_cast<hsize_t>(first_row);
    extent[0] = static_cast<hsize_t>(rows);
    h5::check(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr, extent.data(), nullptr),
              where_ + ": select in " + name);
  }
  const hsize_t mem_dims[1] = {static_cast<hsize_t>(values.size())};
  const h5::Id mem_space = h5::check_id(H5Screate_simple(1, mem_dims, nullptr), where_ + ": H5Screate_simple");
  h5::check(
      H5Dwrite(h5_->dataset.get(), H5T_NATIVE_FLOAT, mem_space.get(), file_space.get(), H5P_DEFAULT, values.data()),
      where_ + ": write " + name);
}

void Hdf5ArrayFile::close() {
  h5_->dataset = h5::Id();
  h5_->file.close(where_);
}

}  // namespace shardkit::ckpt
