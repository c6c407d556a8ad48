#include "trainer/byte_tokens.hpp"

#include <fcntl.h>

#include <algorithm>
#include <vector>

#include "base/error.hpp"
#include "base/file_util.hpp"
#include "base/write_target.hpp"

namespace shardkit::trainer {

int64_t encode_bytes(const std::filesystem::path& text, const std::filesystem::path& out,
                     const std::function<void(int64_t done, int64_t total)>& progress) {
  const FileDescriptor in = open_input_file(text);
  const int64_t size = in.size();
  if (size == 0) fail(ErrorKind::kInvalidInput, text.string() + ": empty file, nothing to encode");
  // Blocks keep the memory at a few tens of MiB whatever the text's size, and pace the progress reports.
  constexpr int64_t kBlockBytes = int64_t{16} << 20;
  std::vector<unsigned char> bytes(static_cast<size_t>(std::min(size, kBlockBytes)));
  std::vector<uint16_t> tokens(bytes.size());
  std::filesystem::path tmp = out;
  tmp += ".tmp";
  {
    FileDescriptor fd = create_fresh_file(tmp);
    for (int64_t offset = 0; offset < size; offset += kBlockBytes) {
      const size_t n = static_cast<size_t>(std::min(kBlockBytes, size - offset));
      in.pread_exact(bytes.data(), n, offset);
      std::copy_n(bytes.begin(), n, tokens.begin());
      fd.write_all(tokens.data(), n * sizeof(uint16_t));
      if (progress) progress(offset + static_cast<int64_t>(n), size);
    }
    fd.close();
  }
  std::filesystem::rename(tmp, out);
  return size;
}

}  // namespace shardkit::trainer
