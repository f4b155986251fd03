# Tests of daemon/sim: scenarios, the simulator's rules and its validation against a real run.
diloco_test(sim_tests
  sim/test_simulator.cpp
)
target_link_libraries(sim_tests PRIVATE diloco_sim)
add_dependencies(sim_tests dilococtl)

# Alone on the machine: the real run's pace is what the load makes it.
add_executable(sim_validation_tests sim/test_sim_validation.cpp)
target_link_libraries(sim_validation_tests PRIVATE diloco_test_main diloco_sim nlohmann_json::nlohmann_json)
add_dependencies(sim_validation_tests dilococtl)
catch_discover_tests(sim_validation_tests PROPERTIES TIMEOUT 300 RUN_SERIAL TRUE LABELS sim-validation)
