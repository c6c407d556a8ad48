#include "comm/mpi.hpp"

#include <algorithm>
#include <cstdlib>

#include "base/error.hpp"

namespace shardkit::comm {

void check_mpi(int code, const char* call, const char* file, int line) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  fail(ErrorKind::kInternal, std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " +
                                 std::string(text, static_cast<size_t>(length)));
}

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  int provided = 0;
  MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
  MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
  if (size_ > 1) watchdog_ = std::make_unique<CollectiveWatchdog>(rank_, size_);
}

MpiRuntime::~MpiRuntime() {
  watchdog_.reset();
  MPI_Finalize();
}

void MpiRuntime::abort(int exit_code) {
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::exit(exit_code);  // MPI_Abort does not return; this only satisfies [[noreturn]]
}

DuplicateCommunicator::DuplicateCommunicator(MPI_Comm parent) {
  const CollectiveTimer timer("MPI_Comm_dup");
  MPI_CHECK(MPI_Comm_dup(parent, &comm_));
  MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
}

DuplicateCommunicator::~DuplicateCommunicator() {
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

NodeCommunicator::NodeCommunicator(MPI_Comm parent) {
  const CollectiveTimer timer("MPI_Comm_split_type");
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(parent, &rank));
  MPI_CHECK(MPI_Comm_split_type(parent, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &comm_));
  MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
}

NodeCommunicator::~NodeCommunicator() {
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

bool threads_may_communicate() {
  int level = MPI_THREAD_SINGLE;
  return MPI_Query_thread(&level) == MPI_SUCCESS && level >= MPI_THREAD_MULTIPLE;
}

MpiCollective::MpiCollective(MPI_Comm comm) : comm_(comm) {
  MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

std::vector<std::string> MpiCollective::gather(const std::string& mine) {
  const CollectiveTimer timer("gather");
  const int length = static_cast<int>(mine.size());
  std::vector<int> lengths(rank_ == 0 ? static_cast<size_t>(size_) : 0);
  MPI_CHECK(MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, comm_));
  std::vector<int> displacements(lengths.size());
  std::string all;
  if (rank_ == 0) {
    int offset = 0;
    for (size_t i = 0; i < lengths.size(); ++i) {
      displacements[i] = offset;
      offset += lengths[i];
    }
    all.resize(static_cast<size_t>(offset));
  }
  MPI_CHECK(
      MPI_Gatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(), displacements.data(), MPI_CHAR, 0, comm_));
  std::vector<std::string> out;
  if (rank_ == 0) {
    for (size_t i = 0; i < lengths.size(); ++i) {
      out.push_back(all.substr(static_cast<size_t>(displacements[i]), static_cast<size_t>(lengths[i])));
    }
  }
  return out;
}

std::string MpiCollective::broadcast(const std::string& from_root) {
  const CollectiveTimer timer("broadcast");
  int length = rank_ == 0 ? static_cast<int>(from_root.size()) : 0;
  MPI_CHECK(MPI_Bcast(&length, 1, MPI_INT, 0, comm_));
  std::string out = rank_ == 0 ? from_root : std::string(static_cast<size_t>(length), '\0');
  MPI_CHECK(MPI_Bcast(out.data(), length, MPI_CHAR, 0, comm_));
  return out;
}

void MpiCollective::barrier() {
  const CollectiveTimer timer("barrier");
  MPI_CHECK(MPI_Barrier(comm_));
}

namespace {

constexpr int64_t kMaxCount = int64_t{1} << 30;  // elements per MPI call (int counts)

int checked_count(int64_t count, const char* what) {
  if (count < 0 || count > kMaxCount) {
    fail(ErrorKind::kInternal, std::string(what) + ": " + std::to_string(count) +
                                   " elements exceed one MPI call; partitions this large need more ranks");
  }
  return static_cast<int>(count);
}

}  // namespace

void MpiCollective::allreduce_sum(float* data, int64_t count) {
  const CollectiveTimer timer("allreduce");
  for (int64_t done = 0; done < count; done += kMaxCount) {
    const int n = static_cast<int>(std::min(kMaxCount, count - done));
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data + done, n, MPI_FLOAT, MPI_SUM, comm_));
  }
}

void MpiCollective::allreduce_sum(double* data, int64_t count) {
  const CollectiveTimer timer("allreduce");
  for (int64_t done = 0; done < count; done += kMaxCount) {
    const int n = static_cast<int>(std::min(kMaxCount, count - done));
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data + done, n, MPI_DOUBLE, MPI_SUM, comm_));
  }
}

double MpiCollective::allreduce_sum(double value) {
  const CollectiveTimer timer("allreduce");
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, MPI_SUM, comm_));
  return value;
}

double MpiCollective::allreduce_max(double value) {
  const CollectiveTimer timer("allreduce");
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, MPI_MAX, comm_));
  return value;
}

void MpiCollective::reduce_scatter_block(const float* send, float* recv, int64_t block) {
  const CollectiveTimer timer("reduce_scatter");
  MPI_CHECK(
      MPI_Reduce_scatter_block(send, recv, checked_count(block, "reduce_scatter_block"), MPI_FLOAT, MPI_SUM, comm_));
}

void MpiCollective::reduce_scatter(const float* send, float* recv, const std::vector<int>& counts) {
  const CollectiveTimer timer("reduce_scatter");
  MPI_CHECK(MPI_Reduce_scatter(send, recv, counts.data(), MPI_FLOAT, MPI_SUM, comm_));
}

void MpiCollective::allgather(const float* send, float* recv, int64_t block) {
  const CollectiveTimer timer("allgather");
  const int n = checked_count(block, "allgather");
  MPI_CHECK(MPI_Allgather(send, n, MPI_FLOAT, recv, n, MPI_FLOAT, comm_));
}

void MpiCollective::allgather_inplace(float* data, int64_t block) {
  const CollectiveTimer timer("allgather");
  const int n = checked_count(block, "allgather");
  MPI_CHECK(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, n, MPI_FLOAT, comm_));
}

void MpiCollective::broadcast_bytes(void* data, int64_t bytes) {
  const CollectiveTimer timer("broadcast");
  MPI_CHECK(MPI_Bcast(data, checked_count(bytes, "broadcast"), MPI_BYTE, 0, comm_));
}

MpiCollective::NodePlace MpiCollective::node_place() {
  const NodeCommunicator node(comm_);
  NodePlace place;
  MPI_CHECK(MPI_Comm_rank(node.get(), &place.rank));
  MPI_CHECK(MPI_Comm_size(node.get(), &place.size));
  return place;
}

}  // namespace shardkit::comm
