# The Gloo local ring (kernels/comm/gloo_comm.h), when libgloo-dev was found:
# gloo_comm_tests spawns gloo_comm_worker processes that form rings over
# loopback TCP. Included from tests/CMakeLists.txt.
if(NOT DILOCO_HAVE_GLOO)
  message(STATUS "dilocod: no Gloo (install libgloo-dev): gloo_comm_tests not built")
  return()
endif()
find_package(Threads REQUIRED)
add_executable(gloo_comm_worker ${CMAKE_CURRENT_LIST_DIR}/gloo_worker.cpp)
target_include_directories(gloo_comm_worker PRIVATE ${PROJECT_SOURCE_DIR})
target_link_libraries(gloo_comm_worker PRIVATE diloco_gloo diloco_backend Threads::Threads)

diloco_test(gloo_comm_tests ${CMAKE_CURRENT_LIST_DIR}/test_gloo_comm.cpp)
target_link_libraries(gloo_comm_tests PRIVATE diloco_gloo diloco_backend Threads::Threads)
target_compile_definitions(gloo_comm_tests PRIVATE GLOO_WORKER_PATH="$<TARGET_FILE:gloo_comm_worker>")
add_dependencies(gloo_comm_tests gloo_comm_worker)
