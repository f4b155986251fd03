# Transport: RAII ZeroMQ sockets, channels, sequence/liveness/Clone logic, link shaper, CURVE + ZAP.
find_package(PkgConfig REQUIRED)
pkg_check_modules(ZMQ REQUIRED IMPORTED_TARGET libzmq)
pkg_check_modules(SODIUM REQUIRED IMPORTED_TARGET libsodium)
find_path(CPPZMQ_INCLUDE_DIR zmq.hpp)
if(NOT CPPZMQ_INCLUDE_DIR)
  message(FATAL_ERROR "zmq.hpp not found: install cppzmq (Debian: cppzmq-dev)")
endif()
find_package(Threads REQUIRED)
target_sources(diloco_net PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/channel.cpp
  ${CMAKE_CURRENT_LIST_DIR}/chunk_assembler.cpp
  ${CMAKE_CURRENT_LIST_DIR}/chunk_frame.cpp
  ${CMAKE_CURRENT_LIST_DIR}/clone.cpp
  ${CMAKE_CURRENT_LIST_DIR}/context.cpp
  ${CMAKE_CURRENT_LIST_DIR}/curve.cpp
  ${CMAKE_CURRENT_LIST_DIR}/link_shaper.cpp
  ${CMAKE_CURRENT_LIST_DIR}/liveness.cpp
  ${CMAKE_CURRENT_LIST_DIR}/net_log.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sequence.cpp
  ${CMAKE_CURRENT_LIST_DIR}/socket.cpp
  ${CMAKE_CURRENT_LIST_DIR}/transport_bench.cpp
  ${CMAKE_CURRENT_LIST_DIR}/wire_transport.cpp
  ${CMAKE_CURRENT_LIST_DIR}/zap.cpp
)
target_include_directories(diloco_net PUBLIC ${CPPZMQ_INCLUDE_DIR})
target_link_libraries(diloco_net PUBLIC PkgConfig::ZMQ PkgConfig::SODIUM Threads::Threads)
# The local control socket's own transport (an AF_UNIX stream, bounded per message and connection).
target_sources(diloco_net PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/local_socket.cpp
  ${CMAKE_CURRENT_LIST_DIR}/stream_frames.cpp
)
