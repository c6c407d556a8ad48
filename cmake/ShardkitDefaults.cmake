# Compiler settings shared by every shardkit target: warnings, optional sanitizers.

set(SHARDKIT_WARNINGS -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wcast-align -Woverloaded-virtual
                      -Wdouble-promotion -Wformat=2 -Wimplicit-fallthrough)
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
