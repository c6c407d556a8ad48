// A rank's swap file under the NVMe folder: created fresh and allocated in full up front (so that a
// full disk shows at start-up, not halfway through a step), locked while the run lives, removed when
// it ends. Opened with O_DIRECT where the file system supports it: the swapped states pass through
// the page cache otherwise, taking the host memory the offload is there to save.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>

#include "base/file_util.hpp"
#include "comm/mpi.hpp"

namespace shardkit::trainer::nvme {

// One swap file a rank is about to create: `bytes` bytes in `dir`, for `what` (named in errors).
struct SwapNeed {
  std::filesystem::path dir;
  int64_t bytes = 0;
  std::string what;
};

// Before any rank creates its swap files: checks every folder of `needs` (as SwapFile does), then that
// the swap files of all the ranks of this node fit together. Free space belongs to a file system, not
// to a folder, so the node's needs are summed per file system (the folders' st_dev: ranks may name
// the same folder, different folders on one disk, or different disks); a shortfall is
// Error(kInvalidInput) on every rank of the node, naming the folder, its free bytes, what the node's
// ranks need there and this rank's share. File systems that report no size (ramfs) are not checked.
// Collective over `comm` (every rank calls it, `needs` empty where a rank swaps nothing).
void check_node_free_space(comm::MpiCollective& comm, std::span<const SwapNeed> needs);

class SwapFile {
 public:
  // Creates `dir`/`name` with `bytes` bytes allocated. One-line errors naming the path and what was
  // expected: `dir` missing, not a directory or not writable, no room for `bytes` bytes (`what_needs`
  // says what they are for; check_node_free_space checks up front for the node's ranks together), `name`
  // held by a live run (its lock is taken), or anything but a regular file at `name` (a directory, a
  // FIFO, a symbolic link, a device: never opened, followed or removed). A file of that name that no
  // live process holds is left over from a run that was killed: it is replaced, and `notice` says so.
  // `notice` also says when the file system refuses O_DIRECT.
  SwapFile(const std::filesystem::path& dir, const std::string& name, int64_t bytes, const std::string& what_needs,
           const std::function<void(const std::string&)>& notice);
  // Removes the file (its blocks are freed once the descriptor closes).
  ~SwapFile();
  SwapFile(const SwapFile&) = delete;
  SwapFile& operator=(const SwapFile&) = delete;

  int fd() const noexcept { return fd_.get(); }
  const std::filesystem::path& path() const noexcept { return fd_.path(); }
  int64_t bytes() const noexcept { return bytes_; }
  bool direct() const noexcept { return direct_; }

 private:
  FileDescriptor fd_;
  int64_t bytes_ = 0;
  bool direct_ = false;
};

// "shardkit-<host>-<pid of rank 0>-<what>-rank<r>-of-<w>.swap": one name per job (rank 0's host and
// process id, broadcast) and rank, so that neither two runs sharing a folder nor two ranks collide.
// Collective.
std::string rank_swap_name(comm::MpiCollective& comm, const std::string& what);

}  // namespace shardkit::trainer::nvme
