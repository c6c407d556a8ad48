// open_async_io in builds without liburing: a clear error instead of a missing feature.
#include "base/error.hpp"
#include "trainer/nvme/aio.hpp"

namespace shardkit::trainer::nvme {

std::unique_ptr<AsyncIo> open_async_io(int, const std::filesystem::path& path, unsigned, size_t) {
  fail(ErrorKind::kInvalidInput, path.string() +
                                     ": NVMe offload needs io_uring, and this shardkit was built without liburing "
                                     "(install liburing-dev, e.g. by scripts/setup-debian.sh, and configure again)");
}

}  // namespace shardkit::trainer::nvme
