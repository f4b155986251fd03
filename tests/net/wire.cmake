diloco_test(net_wire_tests ${CMAKE_CURRENT_LIST_DIR}/test_wire.cpp)
target_link_libraries(net_wire_tests PRIVATE diloco_net)
