// MPI for shardkit's CPU ranks: initialisation and shutdown (RAII), error checking with file and
// line, and the ckpt::Collective implementation that the save protocol runs on.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/collective.hpp"
#include "comm/watchdog.hpp"

namespace shardkit::comm {

// Throws shardkit::Error(kInternal) naming the call, file, line and MPI's error string.
void check_mpi(int code, const char* call, const char* file, int line);
#define MPI_CHECK(call) ::shardkit::comm::check_mpi((call), #call, __FILE__, __LINE__)

// Initialises MPI (MPI_THREAD_MULTIPLE, so that background checkpoint threads may communicate on
// their own communicators) and finalises it on destruction. MPI errors return codes instead of
// aborting, so that they become exceptions with context. A process started without mpirun is a
// world of one rank. With other ranks, a CollectiveWatchdog runs while MPI does: a collective that
// waits longer than collective_timeout_seconds() for them ends the job.
class MpiRuntime {
 public:
  MpiRuntime(int* argc, char*** argv);
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  // Ends every rank of the job after this one printed its error: a failure never leaves the others
  // waiting in a collective.
  [[noreturn]] static void abort(int exit_code);

 private:
  int rank_ = 0;
  int size_ = 1;
  std::unique_ptr<CollectiveWatchdog> watchdog_;
};

// An MPI communicator (not owned): the string collectives of ckpt::Collective for the save
// protocol, and the fp32 collectives of ZeRO on CPU ranks. Counts are elements; calls larger than
// MPI's int counts are split. Every collective is timed by a CollectiveTimer.
class MpiCollective final : public ckpt::Collective {
 public:
  explicit MpiCollective(MPI_Comm comm);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::vector<std::string> gather(const std::string& mine) override;
  std::string broadcast(const std::string& from_root) override;
  void barrier();
  MPI_Comm comm() const noexcept { return comm_; }

  // In-place sum over all ranks.
  void allreduce_sum(float* data, int64_t count);
  void allreduce_sum(double* data, int64_t count);
  double allreduce_sum(double value);
  double allreduce_max(double value);
  // send holds size() blocks of `block` elements; rank r receives the sum of every rank's block r.
  void reduce_scatter_block(const float* send, float* recv, int64_t block);
  // send holds the concatenation of blocks of counts[r] elements, in rank order; this rank receives
  // the sum of its block (counts[rank()] elements).
  void reduce_scatter(const float* send, float* recv, const std::vector<int>& counts);
  // recv (size() * block) = every rank's `block` elements of send, in rank order.
  void allgather(const float* send, float* recv, int64_t block);
  // data holds size() blocks; this rank's block is sent to all, the others are received in place.
  void allgather_inplace(float* data, int64_t block);
  // Rank 0's bytes to every rank.
  void broadcast_bytes(void* data, int64_t bytes);

  // This rank's place among the ranks of its node (those that share its memory): which GPU it takes,
  // how many ranks split the node's cores. Collective.
  struct NodePlace {
    int rank = 0;
    int size = 1;
  };
  NodePlace node_place();

 private:
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
};

// A duplicate of a communicator (MPI_Comm_dup), freed on destruction: collectives on it never match
// those of the original, so a background thread (an asynchronous checkpoint's commit) can use it
// while the training loop uses the original.
class DuplicateCommunicator {
 public:
  explicit DuplicateCommunicator(MPI_Comm parent);
  ~DuplicateCommunicator();
  DuplicateCommunicator(const DuplicateCommunicator&) = delete;
  DuplicateCommunicator& operator=(const DuplicateCommunicator&) = delete;
  MPI_Comm get() const noexcept { return comm_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
};

// The ranks of one node (those that share memory, MPI_COMM_TYPE_SHARED) as a communicator of their
// own, freed on destruction: for what the ranks of a node decide together (a GPU each, the free space
// of a disk they share). Collective over `parent`.
class NodeCommunicator {
 public:
  explicit NodeCommunicator(MPI_Comm parent);
  ~NodeCommunicator();
  NodeCommunicator(const NodeCommunicator&) = delete;
  NodeCommunicator& operator=(const NodeCommunicator&) = delete;
  MPI_Comm get() const noexcept { return comm_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
};

// Whether MPI runs with MPI_THREAD_MULTIPLE (several threads may call it at once).
bool threads_may_communicate();

}  // namespace shardkit::comm
