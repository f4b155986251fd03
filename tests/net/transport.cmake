diloco_test(net_transport_tests
  ${CMAKE_CURRENT_LIST_DIR}/test_transport.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_link_shaper.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_curve.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_wire_transport.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_chunked_transport.cpp
)
target_link_libraries(net_transport_tests PRIVATE diloco_net)

# The local control socket: its framing (pure) and its server and client on real AF_UNIX sockets.
diloco_test(net_local_socket_tests
  ${CMAKE_CURRENT_LIST_DIR}/test_stream_frames.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_local_socket.cpp
)
target_link_libraries(net_local_socket_tests PRIVATE diloco_net)
