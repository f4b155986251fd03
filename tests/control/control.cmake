# Tests of daemon/control and the daemon config: units, and real dilocod processes ([e2e]).
diloco_test(control_tests
  control/test_daemon_config.cpp
  control/test_job_store.cpp
  control/test_daemon_e2e.cpp
)
target_link_libraries(control_tests PRIVATE diloco_control diloco_export nlohmann_json::nlohmann_json)
# The e2e cases start the real binaries.
add_dependencies(control_tests dilocod dilococtl)
