#include "cli/ranks.hpp"

#include <cstdio>

#include "base/error.hpp"
#include "base/text_format.hpp"

namespace shardkit::cli {

int run_on_ranks(int* argc, char*** argv, const std::function<int(comm::MpiCollective& world)>& body) {
  comm::MpiRuntime mpi(argc, argv);
  comm::MpiCollective world(MPI_COMM_WORLD);
  if (mpi.size() == 1) return body(world);  // errors take the ordinary path through main()
  try {
    return body(world);
  } catch (const std::exception& e) {
    const auto* error = dynamic_cast<const Error*>(&e);
    const int code = error ? exit_code_for(error->kind()) : 1;
    print_line(stderr, "shardkit: error (rank %d of %d): %s", mpi.rank(), mpi.size(), e.what());
    std::fflush(stderr);
    comm::MpiRuntime::abort(code);
  }
}

}  // namespace shardkit::cli
