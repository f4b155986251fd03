diloco_test(local_run_tests
  train/test_local_run.cpp
  train/test_local_shards.cpp
  train/test_inner_loop.cpp
  train/test_resilience.cpp
  train/test_role_plan.cpp
)
target_link_libraries(local_run_tests PRIVATE diloco_train nlohmann_json::nlohmann_json)
