# Wire tests: round trips of every message, framing, reassembly, snapshots (net_wire_tests);
# the fuzz test (net_wire_fuzz_tests, [net][fuzz]; DILOCO_FUZZ_ITERATIONS scales it, default
# 100000); a libFuzzer target when the compiler is clang (not a test, built on request).
diloco_test(net_wire_tests ${CMAKE_CURRENT_LIST_DIR}/test_wire.cpp)
target_link_libraries(net_wire_tests PRIVATE diloco_net)

diloco_test(net_wire_fuzz_tests ${CMAKE_CURRENT_LIST_DIR}/test_wire_fuzz.cpp)
target_link_libraries(net_wire_fuzz_tests PRIVATE diloco_net)

if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  add_executable(fuzz_envelope EXCLUDE_FROM_ALL ${CMAKE_CURRENT_LIST_DIR}/../fuzz/fuzz_envelope.cpp)
  target_compile_options(fuzz_envelope PRIVATE -fsanitize=fuzzer)
  target_link_options(fuzz_envelope PRIVATE -fsanitize=fuzzer)
  target_link_libraries(fuzz_envelope PRIVATE diloco_net)
endif()
