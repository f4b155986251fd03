diloco_test(net_transport_tests
  ${CMAKE_CURRENT_LIST_DIR}/test_transport.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_link_shaper.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_curve.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_wire_transport.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_chunked_transport.cpp
)
target_link_libraries(net_transport_tests PRIVATE diloco_net)
