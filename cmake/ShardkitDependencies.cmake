# Third-party dependencies, all from the distribution's packages (Debian 12 / Ubuntu 24.04).
# Nothing is vendored; scripts/setup-debian.sh installs them.

find_package(Threads REQUIRED)

# HDF5: the serial C API only (Debian installs it under hdf5/serial).
set(HDF5_PREFER_PARALLEL OFF)
find_package(HDF5 REQUIRED COMPONENTS C)
if(HDF5_VERSION VERSION_LESS 1.10.3)
  message(FATAL_ERROR "shardkit needs HDF5 >= 1.10.3 (H5Dwrite_chunk); found ${HDF5_VERSION}")
endif()

find_package(ZLIB REQUIRED)  # CRC-32 of the zip archives torch.save reads

# zstd: prefer its CMake package, fall back to pkg-config (older distributions).
find_package(zstd CONFIG QUIET)
if(TARGET zstd::libzstd_shared)
  add_library(shardkit_zstd INTERFACE)
  target_link_libraries(shardkit_zstd INTERFACE zstd::libzstd_shared)
else()
  find_package(PkgConfig REQUIRED)
  pkg_check_modules(ZSTD REQUIRED IMPORTED_TARGET libzstd)
  add_library(shardkit_zstd INTERFACE)
  target_link_libraries(shardkit_zstd INTERFACE PkgConfig::ZSTD)
endif()

find_package(MPI REQUIRED COMPONENTS CXX)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 2.1 REQUIRED)
if(SHARDKIT_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()

# CUDA and NCCL are optional: found when present (the GPU backend builds on them); without them the
# CPU build is complete.
include(CheckLanguage)
check_language(CUDA)
set(SHARDKIT_HAVE_CUDA OFF)
if(CMAKE_CUDA_COMPILER)
  find_package(CUDAToolkit QUIET)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_LIBRARY_ROOT}/include)
  find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib64)
  if(CUDAToolkit_FOUND AND NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    set(SHARDKIT_HAVE_CUDA ON)
  endif()
endif()
option(SHARDKIT_CUDA "Build the CUDA/NCCL backend (needs nvcc and NCCL)" ${SHARDKIT_HAVE_CUDA})
if(SHARDKIT_CUDA AND NOT SHARDKIT_HAVE_CUDA)
  message(FATAL_ERROR "SHARDKIT_CUDA=ON but CUDA or NCCL was not found")
endif()
message(STATUS "shardkit: CUDA ${CUDAToolkit_VERSION} / NCCL found: ${SHARDKIT_HAVE_CUDA}; CUDA backend: ${SHARDKIT_CUDA}")

# Matrix products of the CPU trainer: OpenBLAS when present (Debian: libopenblas-dev), else the
# trainer's built-in fallback. OpenMP parallelises the model's other loops.
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_library(OPENBLAS_LIBRARY NAMES openblas)
find_path(OPENBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas-pthread openblas)
if(OPENBLAS_LIBRARY AND OPENBLAS_INCLUDE_DIR AND EXISTS ${OPENBLAS_INCLUDE_DIR}/openblas_config.h)
  set(SHARDKIT_HAVE_CBLAS ON)
else()
  set(SHARDKIT_HAVE_CBLAS OFF)
endif()
message(STATUS "shardkit: OpenBLAS for the CPU trainer: ${SHARDKIT_HAVE_CBLAS}")

# The NVMe offload's asynchronous I/O: io_uring through liburing (Debian: liburing-dev;
# trainer/nvme/aio.hpp says why io_uring). Without it the build goes on and a run that asks for
# NVMe offload is refused with a message saying what to install.
find_package(PkgConfig REQUIRED)
pkg_check_modules(LIBURING IMPORTED_TARGET liburing)
if(LIBURING_FOUND)
  set(SHARDKIT_HAVE_LIBURING ON)
else()
  set(SHARDKIT_HAVE_LIBURING OFF)
endif()
message(STATUS "shardkit: io_uring (liburing) for the NVMe optimizer offload: ${SHARDKIT_HAVE_LIBURING}")
