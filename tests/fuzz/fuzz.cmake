# libFuzzer harnesses for the memory modules, included from tests/extra.cmake.
# Built only with -DLLMEM_FUZZ=ON and clang (-DCMAKE_C_COMPILER=clang):
#   fuzz_state_read  bytes -> llmem_memory_state_read on a KV cache, a recurrent
#                    memory and a hybrid (docs/testing.md)
#   fuzz_ops         bytes -> operation sequences on small hybrids
#   fuzz_safetensors bytes -> safetensors files (and an index) -> the tensor table
#   fuzz_config      bytes -> config.json parsing
#   fuzz_tokenizer_load  bytes -> tokenizer.json + tokenizer_config.json,
#                    then encode / decode / detokenize text
#   fuzz_serve_api   bytes -> the request bodies of `llmem serve`
# (tests/CMakeLists.txt adds fuzz_tokenizer and fuzz_chat_template.)
# Each links a copy of the library built with -fsanitize=fuzzer-no-link,address,
# undefined (the regular libllmem stays uninstrumented). ctest runs each for
# LLMEM_FUZZ_SECONDS (20) seconds (label `fuzz`) from the committed seeds of
# tests/fuzz/corpus/<name> and the ones a harness writes itself.

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
set(LLMEM_FUZZ_SECONDS 20 CACHE STRING "seconds ctest runs each libFuzzer harness")

# llmem_add_fuzzer(name source [more sources...]): a harness linked with the
# instrumented library, and its ctest (label `fuzz`, LLMEM_FUZZ_SECONDS).
# Corpus: new inputs go to fuzz/<name>/corpus in the build tree; the
# committed seeds of tests/fuzz/corpus/<name> (when that folder exists) and
# the ones a harness writes itself into fuzz/<name>/seeds
# (LLMEM_FUZZ_SEED_DIR) are read too. tests/fuzz/dict/<name>.dict, when it
# exists, is the harness's libFuzzer dictionary (tests/fuzz/make_corpus.py).
function(llmem_add_fuzzer name)
  add_executable(${name} ${ARGN})
  target_compile_options(${name} PRIVATE ${LLMEM_FUZZ_FLAGS} ${LLMEM_WARN_FLAGS})
  target_compile_definitions(${name} PRIVATE _GNU_SOURCE LLMEM_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
  target_include_directories(${name} PRIVATE ${CMAKE_SOURCE_DIR}/tests ${CMAKE_SOURCE_DIR})
  target_link_options(${name} PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(${name} PRIVATE llmem_fuzz_core PkgConfig::XXHASH PkgConfig::CJSON)
  set(dirs ${LLMEM_FUZZ_OUT}/${name}/corpus ${LLMEM_FUZZ_OUT}/${name}/seeds)
  if(EXISTS ${CMAKE_SOURCE_DIR}/tests/fuzz/corpus/${name})
    list(APPEND dirs ${CMAKE_SOURCE_DIR}/tests/fuzz/corpus/${name})
  endif()
  set(opts -max_total_time=${LLMEM_FUZZ_SECONDS} -timeout=10 -rss_limit_mb=2048
    -artifact_prefix=${LLMEM_FUZZ_OUT}/${name}/)
  if(EXISTS ${CMAKE_SOURCE_DIR}/tests/fuzz/dict/${name}.dict)
    list(APPEND opts -dict=${CMAKE_SOURCE_DIR}/tests/fuzz/dict/${name}.dict)
  endif()
  file(MAKE_DIRECTORY ${LLMEM_FUZZ_OUT}/${name}/corpus ${LLMEM_FUZZ_OUT}/${name}/seeds)
  add_test(NAME ${name} COMMAND ${name} ${opts} ${dirs})
  set_tests_properties(${name} PROPERTIES LABELS fuzz TIMEOUT 180
    ENVIRONMENT "LLMEM_FUZZ_SEED_DIR=${LLMEM_FUZZ_OUT}/${name}/seeds")
endfunction()

foreach(name fuzz_state_read fuzz_ops fuzz_safetensors fuzz_config fuzz_tokenizer_load)
  llmem_add_fuzzer(${name} ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/${name}.c)
endforeach()
# the request parser of `llmem serve` is CLI code, not the library's
llmem_add_fuzzer(fuzz_serve_api ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_serve_api.c
  ${CMAKE_SOURCE_DIR}/examples/cli/serve_api.c ${CMAKE_SOURCE_DIR}/examples/cli/serve_text.c
  ${CMAKE_SOURCE_DIR}/examples/cli/engine.c ${CMAKE_SOURCE_DIR}/examples/cli/prefix_probe.c
  ${CMAKE_SOURCE_DIR}/models/hf_json.c)
