#include "ckpt/h5.hpp"

#include <mutex>
#include <utility>

#include "ckpt/zstd_filter.hpp"

namespace shardkit::ckpt::h5 {
namespace {

herr_t collect_message(unsigned /*n*/, const H5E_error2_t* entry, void* client) {
  auto* out = static_cast<std::string*>(client);
  if (entry->desc && *entry->desc) {
    if (!out->empty()) *out += "; ";
    *out += entry->desc;
  }
  return 0;
}

}  // namespace

void init_thread() {
  thread_local bool initialized = false;
  if (initialized) return;
  initialized = true;
  // No HDF5 clean-up at exit: a file whose close failed (a full disk during a save the trainer then
  // went on from) stays half-closed in HDF5's tables, and closing it again at exit crashed the process
  // (H5F__close_cb). Every file shardkit writes is closed explicitly and made durable before use.
  static std::once_flag library;
  std::call_once(library, [] {
    H5dont_atexit();
    if (H5PLset_loading_state(0) < 0) {
      fail(ErrorKind::kInternal, "cannot switch off HDF5 plugin loading: " + error_stack_message());
    }
  });
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  static std::once_flag registered;
  std::call_once(registered, [] {
    if (H5Zregister(&kZstdFilterClass) < 0) {
      fail(ErrorKind::kInternal, "cannot register the zstd HDF5 filter: " + error_stack_message());
    }
  });
}

std::string error_stack_message() {
  std::string message;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, collect_message, &message);
  H5Eclear2(H5E_DEFAULT);
  return message.empty() ? "unknown HDF5 error" : message;
}

void check(herr_t status, const std::string& context, ErrorKind kind) {
  if (status < 0) fail(kind, context + ": " + error_stack_message());
}

Id check_id(hid_t id, const std::string& context, ErrorKind kind) {
  if (id < 0) fail(kind, context + ": " + error_stack_message());
  return Id(id);
}

namespace {

herr_t close_id(hid_t id) {
  switch (H5Iget_type(id)) {
    case H5I_FILE:
      return H5Fclose(id);
    case H5I_GROUP:
      return H5Gclose(id);
    case H5I_DATASET:
      return H5Dclose(id);
    case H5I_ATTR:
      return H5Aclose(id);
    case H5I_DATASPACE:
      return H5Sclose(id);
    case H5I_DATATYPE:
      return H5Tclose(id);
    case H5I_GENPROP_LST:
      return H5Pclose(id);
    default:
      return H5Idec_ref(id) < 0 ? -1 : 0;
  }
}

}  // namespace

Id::~Id() {
  if (id_ >= 0) {
    close_id(id_);
    H5Eclear2(H5E_DEFAULT);
  }
}

Id::Id(Id&& other) noexcept : id_(std::exchange(other.id_, H5I_INVALID_HID)) {}

Id& Id::operator=(Id&& other) noexcept {
  if (this != &other) {
    if (id_ >= 0) close_id(id_);
    id_ = std::exchange(other.id_, H5I_INVALID_HID);
  }
  return *this;
}

void Id::close(const std::string& context) {
  if (id_ < 0) return;
  check(close_id(std::exchange(id_, H5I_INVALID_HID)), context);
}

Id create_file(const std::filesystem::path& path, int64_t alignment) {
  init_thread();
  Id fapl = check_id(H5Pcreate(H5P_FILE_ACCESS), "H5Pcreate");
  // The 1.10 format checksums every metadata block (superblock, object headers, chunk indexes).
  check(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V110, H5F_LIBVER_V110), "H5Pset_libver_bounds");
  if (alignment > 0) {
    check(H5Pset_alignment(fapl.get(), 64 * 1024, static_cast<hsize_t>(alignment)), "H5Pset_alignment");
  }
  return check_id(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), path.string() + ": cannot create");
}

Id open_file(const std::filesystem::path& path, const std::string& where_given) {
  init_thread();
  const std::string where = where_given.empty() ? path.string() : where_given;
  const htri_t is_hdf5 = H5Fis_hdf5(path.c_str());
  if (is_hdf5 <= 0) {
    H5Eclear2(H5E_DEFAULT);
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) fail(ErrorKind::kInvalidInput, where + ": no such file");
    fail(ErrorKind::kCorrupt, where + ": not an HDF5 file (no HDF5 signature)");
  }
  return check_id(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT),
                  where + ": cannot open HDF5 file (truncated or corrupt?)", ErrorKind::kCorrupt);
}

Id create_group(hid_t loc, const char* name, const std::string& where) {
  return check_id(H5Gcreate2(loc, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                  where + ": cannot create group " + name);
}

bool link_exists(hid_t loc, const char* name) {
  const htri_t r = H5Lexists(loc, name, H5P_DEFAULT);
  if (r < 0) H5Eclear2(H5E_DEFAULT);
  return r > 0;
}

namespace {

struct LinkScan {
  std::vector<std::string> names;
  std::string not_hard;  // the first link that is not a hard link
  size_t max_links = 0;
};

herr_t scan_link(hid_t /*group*/, const char* name, const H5L_info_t* info, void* data) {
  auto* scan = static_cast<LinkScan*>(data);
  if (info->type != H5L_TYPE_HARD) {
    scan->not_hard = name;
    return 1;
  }
  scan->names.emplace_back(name);
  return scan->names.size() > scan->max_links ? 1 : 0;
}

void require_hard_link(hid_t loc, const char* name, const char* what, const std::string& where) {
  if (!link_exists(loc, name)) fail(ErrorKind::kCorrupt, where + ": " + what + " /" + name + " is missing");
  H5L_info_t info{};
  check(H5Lget_info(loc, name, &info, H5P_DEFAULT), where + ": link /" + name, ErrorKind::kCorrupt);
  if (info.type != H5L_TYPE_HARD) {
    fail(ErrorKind::kCorrupt, where + ": " + what + " /" + name + " is a " +
                                  (info.type == H5L_TYPE_EXTERNAL ? "link to another file" : "soft link") +
                                  ", which a shard never holds");
  }
}

}  // namespace

std::vector<std::string> hard_link_names(hid_t group, size_t max_links, const std::string& where) {
  LinkScan scan;
  scan.max_links = max_links;
  hsize_t index = 0;
  check(H5Literate(group, H5_INDEX_NAME, H5_ITER_NATIVE, &index, scan_link, &scan), where + ": cannot list links",
        ErrorKind::kCorrupt);
  if (!scan.not_hard.empty()) {
    fail(ErrorKind::kCorrupt,
         where + ": /" + scan.not_hard.substr(0, 64) + " is a soft or external link, which a shard never holds");
  }
  return scan.names;
}

Id open_group(hid_t loc, const char* name, const std::string& where) {
  require_hard_link(loc, name, "group", where);
  return check_id(H5Gopen2(loc, name, H5P_DEFAULT), where + ": cannot open group /" + name, ErrorKind::kCorrupt);
}

Id open_dataset(hid_t loc, const char* name, const std::string& where) {
  require_hard_link(loc, name, "dataset", where);
  return check_id(H5Dopen2(loc, name, H5P_DEFAULT), where + ": cannot open dataset /" + name, ErrorKind::kCorrupt);
}

std::vector<H5Z_filter_t> checked_storage(hid_t dataset, const std::string& where) {
  Id dcpl = check_id(H5Dget_create_plist(dataset), where + ": H5Dget_create_plist", ErrorKind::kCorrupt);
  const H5D_layout_t layout = H5Pget_layout(dcpl.get());
  if (layout == H5D_VIRTUAL) fail(ErrorKind::kCorrupt, where + " is a virtual dataset (data in other files)");
  if (layout != H5D_CHUNKED && layout != H5D_CONTIGUOUS && layout != H5D_COMPACT) {
    fail(ErrorKind::kCorrupt, where + " has an unknown storage layout");
  }
  const int external = H5Pget_external_count(dcpl.get());
  if (external != 0) fail(ErrorKind::kCorrupt, where + " keeps its data in external files");
  const int count = H5Pget_nfilters(dcpl.get());
  if (count < 0 || count > 32) fail(ErrorKind::kCorrupt, where + " has an invalid filter pipeline");
  std::vector<H5Z_filter_t> filters;
  for (int i = 0; i < count; ++i) {
    unsigned flags = 0;
    size_t values_count = 0;
    unsigned config = 0;
    const H5Z_filter_t id =
        H5Pget_filter2(dcpl.get(), static_cast<unsigned>(i), &flags, &values_count, nullptr, 0, nullptr, &config);
    if (id < 0) fail(ErrorKind::kCorrupt, where + " has an unreadable filter pipeline");
    filters.push_back(id);
  }
  return filters;
}

namespace {

Id vlen_string_type() {
  Id type = check_id(H5Tcopy(H5T_C_S1), "H5Tcopy");
  check(H5Tset_size(type.get(), H5T_VARIABLE), "H5Tset_size");
  check(H5Tset_cset(type.get(), H5T_CSET_UTF8), "H5Tset_cset");
  return type;
}

Id open_attribute(hid_t obj, const char* name, const std::string& where) {
  const htri_t exists = H5Aexists(obj, name);
  if (exists <= 0) {
    H5Eclear2(H5E_DEFAULT);
    fail(ErrorKind::kCorrupt, where + ": attribute '" + std::string(name) + "' is missing");
  }
  return check_id(H5Aopen(obj, name, H5P_DEFAULT), where + ": cannot open attribute " + name, ErrorKind::kCorrupt);
}

}  // namespace

void write_attribute(hid_t obj, const char* name, int64_t value, const std::string& where) {
  Id space = check_id(H5Screate(H5S_SCALAR), "H5Screate");
  Id attr = check_id(H5Acreate2(obj, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                     where + ": cannot create attribute " + name);
  check(H5Awrite(attr.get(), H5T_NATIVE_INT64, &value), where + ": cannot write attribute " + name);
}

void write_attribute(hid_t obj, const char* name, const std::string& value, const std::string& where) {
  Id type = vlen_string_type();
  Id space = check_id(H5Screate(H5S_SCALAR), "H5Screate");
  Id attr = check_id(H5Acreate2(obj, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
                     where + ": cannot create attribute " + name);
  const char* p = value.c_str();
  check(H5Awrite(attr.get(), type.get(), &p), where + ": cannot write attribute " + name);
}

int64_t read_int_attribute(hid_t obj, const char* name, const std::string& where) {
  Id attr = open_attribute(obj, name, where);
  Id type = check_id(H5Aget_type(attr.get()), where + ": attribute " + name, ErrorKind::kCorrupt);
  Id space = check_id(H5Aget_space(attr.get()), where + ": attribute " + name, ErrorKind::kCorrupt);
  if (H5Tget_class(type.get()) != H5T_INTEGER || H5Sget_simple_extent_npoints(space.get()) != 1) {
    fail(ErrorKind::kCorrupt, where + ": attribute '" + std::string(name) + "' is not an integer");
  }
  int64_t value = 0;
  check(H5Aread(attr.get(), H5T_NATIVE_INT64, &value), where + ": cannot read attribute " + name, ErrorKind::kCorrupt);
  return value;
}

std::string read_string_attribute(hid_t obj, const char* name, const std::string& where) {
  Id attr = open_attribute(obj, name, where);
  Id file_type = check_id(H5Aget_type(attr.get()), where + ": attribute " + name, ErrorKind::kCorrupt);
  Id space = check_id(H5Aget_space(attr.get()), where + ": attribute " + name, ErrorKind::kCorrupt);
  if (H5Tget_class(file_type.get()) != H5T_STRING || H5Tis_variable_str(file_type.get()) <= 0 ||
      H5Sget_simple_extent_npoints(space.get()) != 1) {
    H5Eclear2(H5E_DEFAULT);
    fail(ErrorKind::kCorrupt, where + ": attribute '" + std::string(name) + "' is not a string");
  }
  Id type = vlen_string_type();
  char* p = nullptr;
  check(H5Aread(attr.get(), type.get(), &p), where + ": cannot read attribute " + name, ErrorKind::kCorrupt);
  std::string value = p ? p : "";
  H5free_memory(p);
  return value;
}

namespace {

void write_whole(hid_t loc, const char* name, hid_t file_type, hid_t mem_type, const std::vector<hsize_t>& dims,
                 const void* data, const std::string& where) {
  Id space = check_id(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), "H5Screate_simple");
  Id ds = check_id(H5Dcreate2(loc, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                   where + ": cannot create dataset " + name);
  hsize_t total = 1;
  for (hsize_t d : dims) total *= d;
  if (total > 0) check(H5Dwrite(ds.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), where + ": write " + name);
}

template <typename T>
std::vector<T> read_whole(hid_t loc, const char* name, hid_t mem_type, const std::vector<hsize_t>& dims,
                          const std::string& where) {
  Id ds = open_dataset(loc, name, where);
  if (!checked_storage(ds.get(), where + ": dataset /" + name).empty()) {
    fail(ErrorKind::kCorrupt, where + ": dataset /" + std::string(name) + " is filtered, which a shard never does");
  }
  Id type = check_id(H5Dget_type(ds.get()), where + ": dataset " + name, ErrorKind::kCorrupt);
  if (H5Tget_class(type.get()) != H5T_INTEGER) {
    fail(ErrorKind::kCorrupt, where + ": dataset /" + std::string(name) + " is not an integer array");
  }
  if (dataset_dims(ds.get(), where) != dims) {
    std::string expected;
    for (hsize_t d : dims) expected += (expected.empty() ? "" : "x") + std::to_string(d);
    fail(ErrorKind::kCorrupt, where + ": dataset /" + std::string(name) + " does not have the expected shape " +
                                  (expected.empty() ? "()" : expected));
  }
  hsize_t total = 1;
  for (hsize_t d : dims) total *= d;
  std::vector<T> out(total);
  if (total > 0) {
    check(H5Dread(ds.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()), where + ": read " + name,
          ErrorKind::kCorrupt);
  }
  return out;
}

}  // namespace

void write_int64_dataset(hid_t loc, const char* name, const std::vector<hsize_t>& dims, const int64_t* data,
                         const std::string& where) {
  write_whole(loc, name, H5T_STD_I64LE, H5T_NATIVE_INT64, dims, data, where);
}

void write_uint64_dataset(hid_t loc, const char* name, hsize_t n, const uint64_t* data, const std::string& where) {
  write_whole(loc, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, {n}, data, where);
}

void write_string_dataset(hid_t loc, const char* name, const std::vector<std::string>& values,
                          const std::string& where) {
  std::vector<const char*> pointers;
  pointers.reserve(values.size());
  for (const std::string& v : values) pointers.push_back(v.c_str());
  Id type = vlen_string_type();
  write_whole(loc, name, type.get(), type.get(), {values.size()}, pointers.data(), where);
}

std::vector<int64_t> read_int64_dataset(hid_t loc, const char* name, const std::vector<hsize_t>& dims,
                                        const std::string& where) {
  return read_whole<int64_t>(loc, name, H5T_NATIVE_INT64, dims, where);
}

std::vector<uint64_t> read_uint64_dataset(hid_t loc, const char* name, hsize_t n, const std::string& where) {
  return read_whole<uint64_t>(loc, name, H5T_NATIVE_UINT64, {n}, where);
}

std::vector<hsize_t> dataset_dims(hid_t dataset, const std::string& where) {
  Id space = check_id(H5Dget_space(dataset), where + ": H5Dget_space", ErrorKind::kCorrupt);
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 0 || rank > 32) fail(ErrorKind::kCorrupt, where + ": dataset has an invalid dataspace");
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  if (rank > 0) H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  return dims;
}

}  // namespace shardkit::ckpt::h5
