# Extra test programs, included by tests/CMakeLists.txt.
#
# 1. Backend plugins for tests/test_backend.c and test_backend_registry.c,
#    built from tests/plugins/testplug.c as MODULE libraries into
#    ${CMAKE_BINARY_DIR}/tests/plugins. The registry finds them only
#    through LLMEM_BACKEND_PATH, which the test sets.
# 2. The libFuzzer harnesses in tests/fuzz/, when that folder has a fuzz.cmake.

set(LLMEM_TEST_PLUGIN_DIR ${CMAKE_BINARY_DIR}/tests/plugins)

# llmem_test_plugin(<target> <plugin name> <output folder> [definitions...])
function(llmem_test_plugin target name dir)
  add_library(${target} MODULE ${CMAKE_CURRENT_SOURCE_DIR}/plugins/testplug.c)
  # $<1:...> keeps multi-config generators from appending a config folder.
  set_target_properties(${target} PROPERTIES
    PREFIX "lib" SUFFIX ".so" OUTPUT_NAME "llmem-${name}"
    LIBRARY_OUTPUT_DIRECTORY "$<1:${dir}>")
  target_include_directories(${target} PRIVATE ${CMAKE_SOURCE_DIR}/include)
  target_compile_options(${target} PRIVATE ${LLMEM_WARN_FLAGS})
  target_compile_definitions(${target} PRIVATE TESTPLUG_NAME="${name}" ${ARGN})
  # Like the real plugins: nothing of libllmem may be left undefined.
  target_link_options(${target} PRIVATE "LINKER:--no-undefined")
endfunction()

llmem_test_plugin(llmem_testplug testplug ${LLMEM_TEST_PLUGIN_DIR})
llmem_test_plugin(llmem_testplug_alt testplug ${LLMEM_TEST_PLUGIN_DIR}/alt TESTPLUG_ALT=1)
llmem_test_plugin(llmem_badabi badabi ${LLMEM_TEST_PLUGIN_DIR} TESTPLUG_ABI_DELTA=1)
llmem_test_plugin(llmem_badvtable badvtable ${LLMEM_TEST_PLUGIN_DIR} TESTPLUG_BAD_VTABLE=1)
llmem_test_plugin(llmem_noentry noentry ${LLMEM_TEST_PLUGIN_DIR} TESTPLUG_NO_ENTRY=1)
llmem_test_plugin(llmem_badlayout badlayout ${LLMEM_TEST_PLUGIN_DIR} TESTPLUG_LAYOUT_DELTA=1)

foreach(_suite test_backend test_backend_registry)
  if(TARGET ${_suite})
    add_dependencies(${_suite} llmem_testplug llmem_testplug_alt llmem_badabi
      llmem_badvtable llmem_noentry llmem_badlayout)
    target_compile_definitions(${_suite} PRIVATE
      LLMEM_TEST_PLUGIN_DIR="${LLMEM_TEST_PLUGIN_DIR}")
    target_link_libraries(${_suite} PRIVATE ${CMAKE_DL_LIBS})
  endif()
endforeach()

# 3. tests/plugin_load.c: NOT linked with libllmem; it dlopens libllmem with
#    RTLD_LOCAL and opens every plugin that was built (issue 12).
add_executable(plugin_load ${CMAKE_CURRENT_SOURCE_DIR}/plugin_load.c)
target_include_directories(plugin_load PRIVATE ${CMAKE_SOURCE_DIR}/include)
target_compile_options(plugin_load PRIVATE ${LLMEM_WARN_FLAGS})
# (the binary's folder relative to the build: a copied build is found from it)
file(RELATIVE_PATH _plugin_load_sub ${CMAKE_BINARY_DIR} ${CMAKE_RUNTIME_OUTPUT_DIRECTORY})
target_compile_definitions(plugin_load PRIVATE _DEFAULT_SOURCE _GNU_SOURCE
  LLMEM_LIB_PATH="$<TARGET_FILE:llmem>"
  LLMEM_BUILD_ROOT="${CMAKE_BINARY_DIR}"
  LLMEM_EXE_SUBDIR="${_plugin_load_sub}"
  LLMEM_PLUGIN_BUILD_DIR="${LLMEM_PLUGIN_BUILD_DIR}"
  LLMEM_TEST_PLUGIN_DIR="${LLMEM_TEST_PLUGIN_DIR}")
target_link_libraries(plugin_load PRIVATE PkgConfig::CHECK ${CMAKE_DL_LIBS})
add_dependencies(plugin_load llmem llmem_testplug llmem_testplug_alt llmem_badabi
  llmem_badvtable llmem_noentry llmem_badlayout)
foreach(_plugin llmem_cuda llmem-vulkan)
  if(TARGET ${_plugin})
    add_dependencies(plugin_load ${_plugin})
  endif()
endforeach()
add_test(NAME plugin_load COMMAND plugin_load)
set_tests_properties(plugin_load PROPERTIES LABELS "core")
# the same from a copy of the build's bin/, lib/ and tests/plugins/
add_test(NAME plugin_load_copy
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/plugin_load_copy.sh ${CMAKE_BINARY_DIR}
    ${_plugin_load_sub} $<TARGET_FILE_NAME:plugin_load>)
set_tests_properties(plugin_load_copy PROPERTIES LABELS "core")

# 4. tests/layers.sh: the #include lines keep the layers of DESIGN.md apart.
add_test(NAME layers COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/layers.sh ${CMAKE_SOURCE_DIR})
set_tests_properties(layers PROPERTIES LABELS "core")

if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz.cmake)
  include(${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz.cmake)
endif()

# 5. tests/test_vulkan_spirv.c reads the modules the vulkan plugin embeds
#    (its generated vk_shaders.c) when the plugin is built.
if(TARGET llmem-vulkan AND TARGET test_vulkan_spirv)
  target_include_directories(test_vulkan_spirv PRIVATE ${CMAKE_BINARY_DIR}/backends/vulkan/generated)
  target_compile_definitions(test_vulkan_spirv PRIVATE LLMEM_VK_SHADERS=1)
  add_dependencies(test_vulkan_spirv llmem_vulkan_spirv)
endif()
find_package(Python3 COMPONENTS Interpreter)
if(TARGET test_vulkan_spirv AND Python3_FOUND)
  add_test(NAME spirv_oracle COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/spirv_oracle.py
    $<TARGET_FILE:test_vulkan_spirv>)
  set_tests_properties(spirv_oracle PROPERTIES LABELS "core;vulkan" SKIP_RETURN_CODE 77)
endif()
