// Which device `shardkit eval` runs on: --device cpu or cuda as asked, and auto (the default) the GPU
// where this build has CUDA and a GPU is visible to every rank, else the CPU, with the reason.
#pragma once

#include <string>
#include <string_view>

#include "comm/mpi.hpp"

namespace shardkit::trainer {

// What this process can use.
struct GpuProbe {
  bool built_with_cuda = false;
  int visible_gpus = 0;        // the devices the CUDA driver shows this process (after CUDA_VISIBLE_DEVICES)
  std::string driver_problem;  // why the driver showed none, when it could not be asked
};

// The probe of this process: the build's CUDA flag and the driver's device count, asked of libcuda
// directly (dlopen), so that a CPU run never loads the CUDA backend (cuBLAS's start-up takes half a
// second) and a machine without the driver is simply one without GPUs.
GpuProbe probe_gpus();

struct DeviceChoice {
  bool cuda = false;
  std::string reason;  // e.g. "auto: 2 GPUs visible", "auto: this shardkit was built without CUDA"
};

// `requested` is "auto", "cpu" or "cuda". Under auto a rank needs a GPU of its own: `local_rank` (its
// place among the ranks of its node, which picks the GPU as for training) below the visible count.
DeviceChoice choose_device(std::string_view requested, const GpuProbe& probe, int local_rank);

// choose_device on every rank with its own probe; auto takes the GPU only where every rank can, so
// that the ranks agree (they score the windows together). Collective.
DeviceChoice choose_device(std::string_view requested, comm::MpiCollective& comm);

}  // namespace shardkit::trainer
