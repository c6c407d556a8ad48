#include "trainer/byte_tokens.hpp"

#include <fcntl.h>

#include <vector>

#include "ckpt/error.hpp"
#include "ckpt/file_util.hpp"

namespace shardkit::trainer {

int64_t encode_bytes(const std::filesystem::path& text, const std::filesystem::path& out) {
  const ckpt::FileDescriptor in(text, O_RDONLY);
  const int64_t size = in.size();
  if (size == 0) fail(ErrorKind::kInvalidInput, text.string() + ": empty file, nothing to encode");
  std::vector<unsigned char> bytes(static_cast<size_t>(size));
  in.pread_exact(bytes.data(), bytes.size(), 0);
  std::vector<uint16_t> tokens(bytes.begin(), bytes.end());
  std::filesystem::path tmp = out;
  tmp += ".tmp";
  {
    ckpt::FileDescriptor fd(tmp, O_WRONLY | O_CREAT | O_TRUNC);
    fd.write_all(tokens.data(), tokens.size() * sizeof(uint16_t));
    fd.close();
  }
  std::filesystem::rename(tmp, out);
  return size;
}

}  // namespace shardkit::trainer
