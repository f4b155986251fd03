# Wire tests: round trips of every message, framing, reassembly, snapshots (net_wire_tests);
# the fuzz test (net_wire_fuzz_tests, [net][fuzz]; DILOCO_FUZZ_ITERATIONS scales it, default
# 100000; DILOCO_FUZZ_SEED picks another run).
diloco_test(net_wire_tests ${CMAKE_CURRENT_LIST_DIR}/test_wire.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_wire_golden.cpp)
target_link_libraries(net_wire_tests PRIVATE diloco_net)

diloco_test(net_wire_fuzz_tests ${CMAKE_CURRENT_LIST_DIR}/test_wire_fuzz.cpp)
target_link_libraries(net_wire_fuzz_tests PRIVATE diloco_net)

# libFuzzer target, only with clang and only on request (`ninja fuzz_envelope`; not a test):
#   ./bin/fuzz_envelope -max_total_time=60 CORPUS_DIR
# The envelope sources are compiled into it so the fuzzer's coverage instrumentation sees the parser.
if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  add_executable(fuzz_envelope EXCLUDE_FROM_ALL
    ${CMAKE_CURRENT_LIST_DIR}/../fuzz/fuzz_envelope.cpp
    ${PROJECT_SOURCE_DIR}/daemon/net/envelope.cpp
    ${PROJECT_SOURCE_DIR}/daemon/net/envelope_checks.cpp
    ${PROJECT_SOURCE_DIR}/daemon/net/envelope_chunks.cpp
    ${PROJECT_SOURCE_DIR}/daemon/net/message_checks.cpp
    ${PROJECT_SOURCE_DIR}/daemon/net/snapshot_assembler.cpp)
  target_compile_options(fuzz_envelope PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_options(fuzz_envelope PRIVATE -fsanitize=fuzzer,address,undefined)
  target_include_directories(fuzz_envelope PRIVATE ${PROJECT_SOURCE_DIR})
  target_link_libraries(fuzz_envelope PRIVATE diloco_util diloco_proto)
endif()
