# Tests of daemon/metrics: the registry's text format and the HTTP endpoint.
diloco_test(metrics_tests
  metrics/test_registry.cpp
  metrics/test_server.cpp
)
target_link_libraries(metrics_tests PRIVATE diloco_metrics)
