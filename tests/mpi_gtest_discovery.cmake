# Script mode (cmake -P), run after a multi-rank test binary is built: asks the binary for its tests
# (--gtest_list_tests, which it answers without starting MPI) and writes a ctest file that registers
# each of them once per rank count, under mpirun. Taking the list from the binary, not from its
# sources, registers every test GoogleTest runs, parameterised and typed ones included.
# Input: PARAMS, a file setting EXECUTABLE, MPIEXEC, NUMPROC_FLAG, RANKS, LABEL, ENVIRONMENT and OUTPUT.
include(${PARAMS})
execute_process(COMMAND ${EXECUTABLE} --gtest_list_tests OUTPUT_VARIABLE listing RESULT_VARIABLE status
                ERROR_VARIABLE errors)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "${EXECUTABLE} --gtest_list_tests failed (${status}): ${errors}")
endif()
string(REPLACE ";" "\\;" listing "${listing}")
string(REPLACE "\n" ";" lines "${listing}")
set(script "")
set(suite "")
set(count 0)
foreach(line IN LISTS lines)
  string(REGEX REPLACE " *#.*$" "" line "${line}")  # "  Name  # GetParam() = ..."
  if(line MATCHES "^([A-Za-z0-9_/]+)\\.$")
    set(suite "${CMAKE_MATCH_1}")
  elseif(line MATCHES "^  ([A-Za-z0-9_/]+)$" AND NOT suite STREQUAL "")
    set(name "${suite}.${CMAKE_MATCH_1}")
    math(EXPR count "${count} + 1")
    foreach(ranks IN LISTS RANKS)
      # "mpi-small" (1-2 ranks) is the part the sanitizer build runs; LABEL overrides.
      if(NOT LABEL STREQUAL "")
        set(label "${LABEL}")
      elseif(ranks LESS_EQUAL 2)
        set(label mpi-small)
      else()
        set(label mpi)
      endif()
      string(APPEND script
             "add_test([=[${name}/np${ranks}]=] [=[${MPIEXEC}]=] ${NUMPROC_FLAG} ${ranks} --oversubscribe "
             "[=[${EXECUTABLE}]=] [=[--gtest_filter=${name}]=])\n"
             "set_tests_properties([=[${name}/np${ranks}]=] PROPERTIES ENVIRONMENT [=[${ENVIRONMENT}]=] "
             "TIMEOUT 300 PROCESSORS ${ranks} LABELS ${label} SKIP_REGULAR_EXPRESSION [=[\\[  SKIPPED \\]]=])\n")
    endforeach()
  endif()
endforeach()
if(count EQUAL 0)
  message(FATAL_ERROR "${EXECUTABLE} lists no tests")
endif()
file(WRITE "${OUTPUT}" "${script}")
