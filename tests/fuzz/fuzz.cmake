# libFuzzer harnesses for the memory modules, included from tests/extra.cmake.
# Built only with -DLLMEM_FUZZ=ON and clang (-DCMAKE_C_COMPILER=clang):
#   fuzz_state_read  bytes -> llmem_memory_state_read on a KV cache, a recurrent
#                    memory and a hybrid (docs/testing.md)
#   fuzz_ops         bytes -> operation sequences on small hybrids
# Each links a copy of the library built with -fsanitize=fuzzer-no-link,address,
# undefined (the regular libllmem stays uninstrumented). ctest runs each for
# 20 seconds (label `fuzz`); seeds are written by the harnesses themselves.

if(NOT LLMEM_FUZZ)
  return()
endif()
if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
  message(WARNING "LLMEM_FUZZ=ON needs clang (-DCMAKE_C_COMPILER=clang); "
                  "the fuzz harnesses are not built with ${CMAKE_C_COMPILER_ID}")
  return()
endif()

set(LLMEM_FUZZ_FLAGS -fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer
  -fno-sanitize-recover=undefined -g)

# The library again, instrumented, with the same definitions and dependencies.
get_target_property(_fz_defs llmem COMPILE_DEFINITIONS)
get_target_property(_fz_libs llmem LINK_LIBRARIES)
add_library(llmem_fuzz_core STATIC ${LLMEM_CORE_SOURCES})
target_include_directories(llmem_fuzz_core PUBLIC ${CMAKE_SOURCE_DIR}/include
  PRIVATE ${CMAKE_SOURCE_DIR})
target_compile_definitions(llmem_fuzz_core PRIVATE ${_fz_defs})
target_compile_options(llmem_fuzz_core PRIVATE ${LLMEM_FUZZ_FLAGS})
target_link_libraries(llmem_fuzz_core PUBLIC ${_fz_libs})

set(LLMEM_FUZZ_OUT ${CMAKE_BINARY_DIR}/fuzz)
foreach(name fuzz_state_read fuzz_ops)
  add_executable(${name} ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/${name}.c)
  target_compile_options(${name} PRIVATE ${LLMEM_FUZZ_FLAGS} ${LLMEM_WARN_FLAGS})
  target_compile_definitions(${name} PRIVATE _POSIX_C_SOURCE=200809L)
  target_include_directories(${name} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR} ${CMAKE_SOURCE_DIR})
  target_link_options(${name} PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(${name} PRIVATE llmem_fuzz_core PkgConfig::XXHASH)
  # corpus: the harness writes its seeds into seeds/ (LLMEM_FUZZ_SEED_DIR),
  # new inputs go to corpus/; both persist in the build tree between runs
  file(MAKE_DIRECTORY ${LLMEM_FUZZ_OUT}/${name}/corpus ${LLMEM_FUZZ_OUT}/${name}/seeds)
  add_test(NAME ${name}
    COMMAND ${name} -max_total_time=20 -timeout=10 -rss_limit_mb=2048
      -artifact_prefix=${LLMEM_FUZZ_OUT}/${name}/
      ${LLMEM_FUZZ_OUT}/${name}/corpus ${LLMEM_FUZZ_OUT}/${name}/seeds)
  set_tests_properties(${name} PROPERTIES LABELS fuzz TIMEOUT 120
    ENVIRONMENT "LLMEM_FUZZ_SEED_DIR=${LLMEM_FUZZ_OUT}/${name}/seeds")
endforeach()
