// Runs a command body on MPI ranks: initialises MPI around it and makes a failure on any rank end
// the whole job with that rank's message (never a hang in a collective).
#pragma once

#include <functional>

#include "comm/mpi.hpp"

namespace shardkit::cli {

// Returns the body's exit code. With more than one rank, an exception prints
// "shardkit: error (rank R of N): ..." and aborts every rank with the error's exit code.
int run_on_ranks(int* argc, char*** argv, const std::function<int(comm::MpiCollective& world)>& body);

}  // namespace shardkit::cli
