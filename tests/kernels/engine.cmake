# Engine tests beyond the op kernels: the backend interface, the local
# ring (threads), the sync-path ops against the wire codec, and (when built
# with CUDA) every CUDA op against its CPU reference. Included from
# tests/CMakeLists.txt.
find_package(Threads REQUIRED)
diloco_test(kernel_engine_tests
  ${CMAKE_CURRENT_LIST_DIR}/test_backend.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_local_comm.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_sync_ops.cpp
  # The wire codec (framing, top-k, error feedback over kernels/sync_ops.h),
  # compiled in so the tests can check the backends' sync ops against it
  # (dependencies: codec_kind.h, util/status.h, and util/task_pool for its threaded encode).
  ${PROJECT_SOURCE_DIR}/daemon/net/codec.cpp
  ${PROJECT_SOURCE_DIR}/daemon/util/task_pool.cpp
)
target_link_libraries(kernel_engine_tests PRIVATE diloco_backend Threads::Threads)

if(DILOCO_HAVE_CUDA)
  # [cuda] tests: skip (with a warning) on machines without a device.
  diloco_test(cuda_tests ${CMAKE_CURRENT_LIST_DIR}/test_cuda_ops.cpp ${CMAKE_CURRENT_LIST_DIR}/test_cuda_ring.cpp
              ${CMAKE_CURRENT_LIST_DIR}/test_cuda_sparse.cpp ${CMAKE_CURRENT_LIST_DIR}/test_cuda_nccl_hosts.cpp
              ${CMAKE_CURRENT_LIST_DIR}/test_cuda_outer_place.cpp)
  # diloco_cuda defines DILOCO_HAVE_NCCL for its users when NCCL was found.
  target_link_libraries(cuda_tests PRIVATE diloco_backend diloco_cuda)
endif()

# scripts/gpu-check.sh's row rules against a CPU Catch2 binary (no GPU needed).
add_test(NAME gpu_check_rows
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/gpu_check_rows.sh ${PROJECT_SOURCE_DIR} $<TARGET_FILE:kernel_engine_tests>)
