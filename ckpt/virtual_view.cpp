#include "ckpt/virtual_view.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <limits>
#include <system_error>
#include <utility>

#include "base/error.hpp"
#include "base/file_util.hpp"
#include "ckpt/checkpoint_reader.hpp"
#include "ckpt/h5.hpp"
#include "ckpt/shard_reader.hpp"

namespace shardkit::ckpt {
namespace {

// A regular box of a tensor's index space. Every box this file builds covers whole trailing
// dimensions after its first partial one, so its elements in row-major order are one contiguous run
// of the tensor's flattened elements, and it maps onto one contiguous run of a flat buffer.
struct Box {
  std::vector<hsize_t> start;
  std::vector<hsize_t> count;
  hsize_t elements = 0;
};

// The rows [lo, hi) of dimension prefix.size(), with the dimensions before it fixed at `prefix`.
Box full_rows(const std::vector<hsize_t>& dims, const std::vector<hsize_t>& prefix, hsize_t lo, hsize_t hi) {
  const size_t d = prefix.size();
  Box box;
  box.start = prefix;
  box.start.push_back(lo);
  box.start.resize(dims.size(), 0);
  box.count.assign(d, 1);
  box.count.push_back(hi - lo);
  box.count.insert(box.count.end(), dims.begin() + static_cast<std::ptrdiff_t>(d) + 1, dims.end());
  box.elements = 1;
  for (hsize_t c : box.count) box.elements *= c;
  return box;
}

// Appends boxes covering elements [begin, end) (0 <= begin < end) of the sub-array at `prefix`, in
// element order: a partial first row (recursively), a block of full rows, a partial last row
// (recursively). A range of an N-D tensor thus becomes at most 2N - 1 boxes.
void decompose(const std::vector<hsize_t>& dims, std::vector<hsize_t>& prefix, hsize_t begin, hsize_t end,
               std::vector<Box>& out) {
  hsize_t row_size = 1;  // elements per index of this dimension
  for (size_t i = prefix.size() + 1; i < dims.size(); ++i) row_size *= dims[i];
  const hsize_t first_row = begin / row_size;
  const hsize_t end_row = end / row_size;  // the row holding `end`, possibly one past the last
  auto within_row = [&](hsize_t row, hsize_t lo, hsize_t hi) {
    prefix.push_back(row);
    decompose(dims, prefix, lo, hi, out);
    prefix.pop_back();
  };
  if (first_row == end_row) {
    within_row(first_row, begin - first_row * row_size, end - first_row * row_size);
    return;
  }
  hsize_t full_begin = first_row;
  if (begin % row_size != 0) {
    within_row(first_row, begin % row_size, row_size);
    ++full_begin;
  }
  if (full_begin < end_row) out.push_back(full_rows(dims, prefix, full_begin, end_row));
  if (end % row_size != 0) within_row(end_row, 0, end % row_size);
}

std::vector<Box> decompose_range(const std::vector<hsize_t>& dims, int64_t offset, int64_t length) {
  std::vector<Box> boxes;
  std::vector<hsize_t> prefix;
  decompose(dims, prefix, static_cast<hsize_t>(offset), static_cast<hsize_t>(offset + length), boxes);
  return boxes;
}

// H5Pset_virtual reads source file and dataset names as printf-like patterns ("%b"); "%%" is a
// literal '%', which may occur in directory names.
std::string vds_literal(const std::string& name) {
  std::string out;
  for (char c : name) {
    out += c;
    if (c == '%') out += '%';
  }
  return out;
}

// Index of each requested state in the manifest; all states when none are requested.
std::vector<int> select_states(const CheckpointReader& reader, const VirtualViewOptions& options) {
  const std::vector<std::string>& available = reader.manifest().states;
  std::vector<int> selected;
  if (options.states.empty()) {
    for (size_t s = 0; s < available.size(); ++s) selected.push_back(static_cast<int>(s));
    return selected;
  }
  for (const std::string& name : options.states) {
    const int index = reader.find_state(name);
    if (index < 0) {
      std::string list;
      for (const std::string& s : available) list += (list.empty() ? "" : ", ") + s;
      fail(ErrorKind::kInvalidInput,
           reader.step_dir().string() + ": no state '" + name + "' in the checkpoint (it has " + list + ")");
    }
    if (std::find(selected.begin(), selected.end(), index) != selected.end()) {
      fail(ErrorKind::kInvalidInput, "state '" + name + "' is requested twice");
    }
    selected.push_back(index);
  }
  return selected;
}

// Opens every shard as a read would (where it lies, size, identity, fragment table, digest): the view
// hard-codes the layout's placements and names the files, so it must not be written over a shard that
// does not hold them or that lies elsewhere.
void validate_shards(const CheckpointReader& reader) {
  for (int rank = 0; rank < reader.manifest().layout.world_size; ++rank) reader.open_shard(rank);
}

// The step directory as the view refers to it: relative to the view's directory, both made canonical
// first. HDF5 appends the stored name to the view's directory and the kernel resolves "..", which
// follows symlinks; a relative path between canonical paths is what the kernel will walk.
std::filesystem::path source_dir_for(const std::filesystem::path& step_dir, const std::filesystem::path& view_dir) {
  return std::filesystem::canonical(step_dir).lexically_relative(std::filesystem::canonical(view_dir));
}

// Where the virtual datasets point: the stored file name of every rank's shard and its flat size.
struct ViewSource {
  const TensorTable* table = nullptr;
  const Layout* layout = nullptr;
  std::vector<std::string> shard_names;  // per rank, escaped for H5Pset_virtual
  hsize_t flat_size = 0;
};

// The creation properties of a tensor's virtual dataset: NaN fill (what a missing shard reads as) and
// one mapping per box of every placement of the tensor. `virtual_space` is the dataset's dataspace
// (its selection is changed); `dims` its dimensions, empty for a scalar.
h5::Id tensor_mappings(const ViewSource& source, int tensor, const std::vector<hsize_t>& dims,
                       const std::string& source_dataset, hid_t virtual_space, const std::string& where) {
  h5::Id dcpl = h5::check_id(H5Pcreate(H5P_DATASET_CREATE), where + ": H5Pcreate");
  // Set explicitly so that an empty tensor, which has no mappings, is still a virtual dataset.
  h5::check(H5Pset_layout(dcpl.get(), H5D_VIRTUAL), where + ": H5Pset_layout");
  const float fill = std::numeric_limits<float>::quiet_NaN();
  h5::check(H5Pset_fill_value(dcpl.get(), H5T_NATIVE_FLOAT, &fill), where + ": H5Pset_fill_value");
  h5::Id flat_space = h5::check_id(H5Screate_simple(1, &source.flat_size, nullptr), where + ": H5Screate_simple");
  const int64_t numel = (*source.table)[static_cast<size_t>(tensor)].numel();
  for (const Placement& p : source.layout->locate(tensor, 0, numel)) {
    // A scalar's one element is the whole (default "all") selection of its 0-dimensional space.
    const std::vector<Box> boxes =
        dims.empty() ? std::vector<Box>{Box{{}, {}, 1}} : decompose_range(dims, p.tensor_offset, p.length);
    auto flat_offset = static_cast<hsize_t>(p.flat_offset);
    for (const Box& box : boxes) {
      if (!dims.empty()) {
        h5::check(
            H5Sselect_hyperslab(virtual_space, H5S_SELECT_SET, box.start.data(), nullptr, box.count.data(), nullptr),
            where + ": H5Sselect_hyperslab");
      }
      h5::check(H5Sselect_hyperslab(flat_space.get(), H5S_SELECT_SET, &flat_offset, nullptr, &box.elements, nullptr),
                where + ": H5Sselect_hyperslab");
      h5::check(H5Pset_virtual(dcpl.get(), virtual_space, source.shard_names[static_cast<size_t>(p.rank)].c_str(),
                               source_dataset.c_str(), flat_space.get()),
                where + ": H5Pset_virtual");
      flat_offset += box.elements;
    }
  }
  return dcpl;
}

// Creates /<state>/<tensor name> in `group`.
void write_tensor(hid_t group, const ViewSource& source, int tensor, const std::string& state,
                  const std::string& file_where) {
  const TensorInfo& info = (*source.table)[static_cast<size_t>(tensor)];
  const std::string where = file_where + ": dataset /" + state + "/" + info.name;
  const std::vector<hsize_t> dims(info.shape.begin(), info.shape.end());
  h5::Id space = h5::check_id(
      dims.empty() ? H5Screate(H5S_SCALAR) : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
      where + ": cannot create the dataspace");
  h5::Id dcpl = tensor_mappings(source, tensor, dims, vds_literal("/state/" + state), space.get(), where);
  h5::Id dataset = h5::check_id(
      H5Dcreate2(group, info.name.c_str(), H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
      where + ": cannot create the virtual dataset");
  dataset.close(where);
}

void write_root_attributes(hid_t root, const Manifest& manifest, const std::string& source_dir,
                           const std::string& where) {
  h5::write_attribute(root, "format", std::string(kVirtualViewFormatName), where);
  h5::write_attribute(root, "format_version", kVirtualViewFormatVersion, where);
  h5::write_attribute(root, "step", manifest.step, where);
  h5::write_attribute(root, "checkpoint_uid", manifest.checkpoint_uid, where);
  h5::write_attribute(root, "model", manifest.model.dump(), where);
  h5::write_attribute(root, "source", source_dir, where);
}

void refuse_existing(const std::filesystem::path& out_file) {
  std::error_code ec;
  // symlink_status, so that a dangling symlink counts as an existing file too.
  const std::filesystem::file_status status = std::filesystem::symlink_status(out_file, ec);
  if (status.type() == std::filesystem::file_type::not_found) return;
  if (ec) fail(ErrorKind::kIo, out_file.string() + ": " + ec.message());
  fail(ErrorKind::kInvalidInput, out_file.string() + ": already exists (a view is never written over a file)");
}

// Removes the half-written view on every way out of write_virtual_view except success.
class TempFileGuard {
 public:
  explicit TempFileGuard(std::filesystem::path path) : path_(std::move(path)) {}
  ~TempFileGuard() {
    std::error_code ec;
    if (!committed_) std::filesystem::remove(path_, ec);
  }
  TempFileGuard(const TempFileGuard&) = delete;
  TempFileGuard& operator=(const TempFileGuard&) = delete;
  void commit() noexcept { committed_ = true; }

 private:
  std::filesystem::path path_;
  bool committed_ = false;
};

}  // namespace

int64_t write_virtual_view(const std::filesystem::path& checkpoint, const std::filesystem::path& out_file,
                           const VirtualViewOptions& options) {
  const CheckpointReader reader(checkpoint);
  const Manifest& manifest = reader.manifest();
  const std::vector<int> states = select_states(reader, options);
  refuse_existing(out_file);
  validate_shards(reader);

  const std::filesystem::path view_dir = std::filesystem::absolute(out_file).parent_path();
  std::error_code ec;
  std::filesystem::create_directories(view_dir, ec);
  if (ec) fail(ErrorKind::kIo, view_dir.string() + ": cannot create the directory: " + ec.message());
  const std::filesystem::path source_dir = source_dir_for(reader.step_dir(), view_dir);
  ViewSource source;
  source.table = &manifest.tensors;
  source.layout = &reader.layout();
  source.flat_size = static_cast<hsize_t>(reader.layout().flat_size());
  for (const ShardRecord& record : manifest.shards) {
    source.shard_names.push_back(vds_literal((source_dir / record.file).lexically_normal().string()));
  }

  const std::filesystem::path tmp_path = std::filesystem::path(out_file) += ".tmp";
  const std::string where = tmp_path.string();
  TempFileGuard guard(tmp_path);
  h5::Id file = h5::create_file(tmp_path);
  write_root_attributes(file.get(), manifest, source_dir.string(), where);
  int64_t written = 0;
  for (int s : states) {
    const std::string& state = manifest.states[static_cast<size_t>(s)];
    h5::Id group = h5::create_group(file.get(), state.c_str(), where);
    for (size_t t = 0; t < manifest.tensors.size(); ++t) {
      write_tensor(group.get(), source, static_cast<int>(t), state, where);
      ++written;
    }
    group.close(where);
  }
  file.close(where + ": closing the HDF5 file");  // flushes HDF5's metadata
  fsync_path(tmp_path);
  if (::rename(tmp_path.c_str(), out_file.c_str()) != 0) {
    fail_errno("rename " + tmp_path.string() + " -> " + out_file.string(), errno);
  }
  guard.commit();
  fsync_directory(view_dir);
  return written;
}

}  // namespace shardkit::ckpt
