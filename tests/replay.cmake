# `llmem replay` under a small page budget: preemptions happen and every
# request's output equals its output served alone (tests/replay.sh).
# Included by tests/CMakeLists.txt.
find_package(Python3 COMPONENTS Interpreter)
if(Python3_FOUND AND TARGET llmem_cli)
  add_test(NAME replay_cpu
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/replay.sh $<TARGET_FILE:llmem_cli> cpu)
  set_tests_properties(replay_cpu PROPERTIES LABELS "replay" TIMEOUT 300
    ENVIRONMENT "LLMEM_MODEL_DIR=${CMAKE_SOURCE_DIR}/models/builtin")
endif()
