#include "convert/torch/torch_file.hpp"

#include <array>
#include <cstring>
#include <vector>

#include "base/error.hpp"
#include "ckpt/dtype_convert.hpp"

namespace shardkit::convert::torch {
namespace {

// Elements converted per read: bounds the staging buffer whatever piece the caller asks for.
constexpr int64_t kReadElems = int64_t{1} << 18;

}  // namespace

TorchFile::TorchFile(const std::filesystem::path& path, ParseBudget* budget) : zip_(path) {
  open(budget);
}

TorchFile::TorchFile(const std::filesystem::path& path, uint64_t offset, uint64_t length, ParseBudget* budget)
    : zip_(path, offset, length) {
  open(budget);
}

void TorchFile::open(ParseBudget* budget) {
  const std::string& where = zip_.where();
  if (zip_.entries().empty()) fail(ErrorKind::kInvalidInput, where + ": an empty zip archive, not a torch.save file");
  // torch.save puts every record in one folder named after the file; its reader takes the folder of
  // the first record, which for this one is the one that holds data.pkl.
  const ZipEntry* pickle = nullptr;
  for (const auto& [name, entry] : zip_.entries()) {
    const size_t slash = name.find('/');
    if (slash != std::string::npos && name.substr(slash + 1) == "data.pkl") {
      if (pickle) fail(ErrorKind::kInvalidInput, where + ": more than one data.pkl record");
      pickle = &entry;
      prefix_ = name.substr(0, slash + 1);
    }
  }
  if (!pickle) fail(ErrorKind::kInvalidInput, where + ": no <archive>/data.pkl record: not a torch.save file");
  if (const ZipEntry* order = zip_.find(prefix_ + "byteorder")) {
    if (zip_.read_all(*order, 16) != "little") {
      fail(ErrorKind::kInvalidInput, where + ": tensors are stored big-endian; only little-endian files are read");
    }
  }
  pickle_ = unpickle(zip_.read_all(*pickle, kMaxPickleBytes), where, budget);
}

const ZipEntry& TorchFile::storage_entry(const TensorRef& tensor, const std::string& what) const {
  const StorageRef& s = *tensor.storage;
  const ZipEntry* entry = zip_.find(prefix_ + "data/" + s.key);
  if (!entry) {
    fail(ErrorKind::kInvalidInput,
         zip_.where() + ": " + what + ": storage record '" + prefix_ + "data/" + s.key + "' is missing");
  }
  // numel was bounded by the pickle's own checks only; the record must hold exactly that many elements.
  const uint64_t elem = dtype_size(s.dtype);
  if (entry->size % elem != 0 || entry->size / elem != static_cast<uint64_t>(s.numel)) {
    fail(ErrorKind::kInvalidInput, zip_.where() + ": " + what + ": storage record '" + entry->name + "' holds " +
                                       std::to_string(entry->size) + " bytes; " + std::to_string(s.numel) +
                                       " elements of " + dtype_name(s.dtype) + " were expected");
  }
  return *entry;
}

void TorchFile::read(const TensorRef& tensor, int64_t offset, std::span<float> out, const std::string& what) const {
  const ZipEntry& entry = storage_entry(tensor, what);
  if (!tensor.contiguous()) {
    fail(ErrorKind::kInvalidInput, zip_.where() + ": " + what +
                                       ": a non-contiguous tensor (torch.save of a "
                                       "DeepSpeed checkpoint writes contiguous ones)");
  }
  const int64_t count = static_cast<int64_t>(out.size());
  if (offset < 0 || offset > tensor.numel() || count > tensor.numel() - offset) {
    fail(ErrorKind::kInternal,
         zip_.where() + ": " + what + ": read past the tensor's " + std::to_string(tensor.numel()) + " elements");
  }
  const Dtype dtype = tensor.storage->dtype;
  const size_t elem = dtype_size(dtype);
  std::vector<std::byte> raw;
  for (int64_t done = 0; done < count;) {
    const int64_t n = std::min(kReadElems, count - done);
    const uint64_t at = static_cast<uint64_t>(tensor.offset + offset + done) * elem;
    float* dst = out.data() + done;
    if (dtype == Dtype::kF32) {
      zip_.read(entry, at, std::as_writable_bytes(std::span<float>(dst, static_cast<size_t>(n))));
    } else {
      raw.resize(static_cast<size_t>(n) * elem);
      zip_.read(entry, at, raw);
      const auto count_n = static_cast<size_t>(n);
      if (dtype == Dtype::kF16 || dtype == Dtype::kBF16) {
        std::vector<uint16_t> h(count_n);
        std::memcpy(h.data(), raw.data(), raw.size());
        const std::span<float> d(dst, count_n);
        dtype == Dtype::kF16 ? ckpt::convert_fp16_to_fp32(h, d) : ckpt::convert_bf16_to_fp32(h, d);
      } else if (dtype == Dtype::kF64) {
        for (size_t i = 0; i < count_n; ++i) {
          double v;
          std::memcpy(&v, raw.data() + i * 8, 8);
          dst[i] = static_cast<float>(v);
        }
      } else {
        fail(ErrorKind::kInvalidInput, zip_.where() + ": " + what + ": a tensor of " + dtype_name(dtype) +
                                           " where a floating-point one was expected");
      }
    }
    done += n;
  }
}

double TorchFile::scalar(const TensorRef& tensor, const std::string& what) const {
  const ZipEntry& entry = storage_entry(tensor, what);
  if (tensor.numel() != 1) {
    fail(ErrorKind::kInvalidInput, zip_.where() + ": " + what + ": a tensor of " + std::to_string(tensor.numel()) +
                                       " elements where one value was expected");
  }
  const Dtype dtype = tensor.storage->dtype;
  std::array<std::byte, 8> raw{};
  zip_.read(entry, static_cast<uint64_t>(tensor.offset) * dtype_size(dtype), std::span(raw).first(dtype_size(dtype)));
  const auto as = [&raw]<typename T>(T) {
    T v;
    std::memcpy(&v, raw.data(), sizeof v);
    return static_cast<double>(v);
  };
  switch (dtype) {
    case Dtype::kF64:
      return as(double{});
    case Dtype::kF32:
      return as(float{});
    case Dtype::kF16:
    case Dtype::kBF16: {
      float f;
      const std::array<uint16_t, 1> h = {static_cast<uint16_t>(as(uint16_t{}))};
      dtype == Dtype::kF16 ? ckpt::convert_fp16_to_fp32(h, std::span(&f, 1))
                           : ckpt::convert_bf16_to_fp32(h, std::span(&f, 1));
      return static_cast<double>(f);
    }
    case Dtype::kI64:
      return as(int64_t{});
    case Dtype::kI32:
      return as(int32_t{});
    case Dtype::kI16:
      return as(int16_t{});
    case Dtype::kI8:
      return as(int8_t{});
    case Dtype::kU8:
    case Dtype::kBool:
      return as(uint8_t{});
  }
  return 0;
}

}  // namespace shardkit::convert::torch
