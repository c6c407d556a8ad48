# Compiler settings shared by every shardkit target: warnings, optional sanitizers.

set(SHARDKIT_WARNINGS -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wcast-align -Woverloaded-virtual
                      -Wdouble-promotion -Wformat=2 -Wimplicit-fallthrough)
# GCC 12 in C++20 mode reports -Wrestrict inside libstdc++'s std::string once `"literal" + string` is
# inlined at -O2 (GCC bug 105329: a memcpy of 2^63 bytes at offset -3), in several tests. Off for
# GCC 12 and older only: what it names is libstdc++'s copy, not this project's code.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
  list(APPEND SHARDKIT_WARNINGS -Wno-restrict)
endif()
if(SHARDKIT_WERROR)
  list(APPEND SHARDKIT_WARNINGS -Werror)
endif()

if(SHARDKIT_SANITIZE)
  # Applied globally so that tests, libraries and the binary agree on the runtime.
  # C/C++ only: device code (nvcc) is not instrumented.
  add_compile_options($<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=address,undefined> $<$<COMPILE_LANGUAGE:C,CXX>:-fno-omit-frame-pointer>
                      $<$<COMPILE_LANGUAGE:C,CXX>:-fno-sanitize-recover=undefined>)
  add_link_options(-fsanitize=address,undefined)
endif()

# shardkit_target_defaults(<target>): the project's warning set on a C++ target.
function(shardkit_target_defaults target)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${SHARDKIT_WARNINGS}>)
endfunction()

# shardkit_cuda_target_defaults(<target>): a target of CUDA kernels and their host code: sm_90 (plus
# PTX), C++20 for nvcc, position-independent (the backend is also a loadable module), line info for
# profilers, and the project's warnings on its .cpp files.
function(shardkit_cuda_target_defaults target)
  # CMake < 3.30 knows no C++20 dialect flag for nvcc: the requirement that CMAKE_CXX_STANDARD_REQUIRED
  # carries over is relaxed here and the flag given directly.
  set_target_properties(${target} PROPERTIES CUDA_ARCHITECTURES "90-real;90-virtual" CUDA_STANDARD_REQUIRED OFF
                                             POSITION_INDEPENDENT_CODE ON)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20 --expt-relaxed-constexpr -lineinfo>)
  target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR})
  shardkit_target_defaults(${target})
endfunction()
