# The virtual runtime (daemon/virt): its clock and link, and whole virtual runs.
diloco_test(virt_tests
  virt/test_virtual_clock.cpp
  virt/test_virtual_run.cpp
)
target_link_libraries(virt_tests PRIVATE diloco_train nlohmann_json::nlohmann_json)
