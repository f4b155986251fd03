# Tests of daemon/control and the daemon config: units, and real dilocod processes ([e2e]).
diloco_test(control_tests
  control/test_daemon_config.cpp
  control/test_job_limits.cpp
  control/test_ring_store.cpp
  control/test_job_store.cpp
  control/test_site_chaos.cpp
  control/test_live_goodput.cpp
  control/test_peer_views.cpp
  control/test_control_loop.cpp
  control/test_site_metrics.cpp
  control/test_control_fuzz.cpp
  control/test_hostile_bench.cpp
  control/test_daemon_e2e.cpp
  control/test_daemon_hardening.cpp
  control/test_shard_join.cpp
)
target_link_libraries(control_tests PRIVATE diloco_control diloco_export nlohmann_json::nlohmann_json)
# The e2e cases start the real binaries.
add_dependencies(control_tests dilocod dilococtl)

# Chaos on a real cluster: 3 daemons in network namespaces (scripts/netns-cluster.sh), a partition
# and a kill -9 + restart while a job trains (about 50 s). Skipped (77) without root, iproute2,
# netns support or jq, with a message naming what is missing. PROCESSORS 3: it runs alone on 2 cores.
# NETNS_CHAOS_STEPS: fewer steps under the sanitizers, so the job stays within about a minute.
if(DILOCO_SANITIZE)
  set(_netns_chaos_steps 6000)
else()
  set(_netns_chaos_steps 30000)
endif()
add_test(NAME netns_chaos COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/cluster/netns_chaos_test.sh)
set_tests_properties(netns_chaos PROPERTIES LABELS cluster SKIP_RETURN_CODE 77 TIMEOUT 300 PROCESSORS 3
  ENVIRONMENT "DILOCO_BIN=${PROJECT_BINARY_DIR}/bin;NETNS_CHAOS_STEPS=${_netns_chaos_steps}")

# The syncer as two shards on two sites, one site killed with -9 for 20 s while the job trains
# (about 90 s). Skipped (77) as netns_chaos is.
add_test(NAME netns_shards COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/cluster/netns_shards_test.sh)
set_tests_properties(netns_shards PROPERTIES LABELS cluster SKIP_RETURN_CODE 77 TIMEOUT 400 PROCESSORS 3
  ENVIRONMENT "DILOCO_BIN=${PROJECT_BINARY_DIR}/bin;NETNS_SHARDS_STEPS=${_netns_chaos_steps}")

# A learner whose ring spans the two hosts of its site (scripts/netns-cluster.sh up 3 --hosts 2:
# five daemons), one host killed with -9 and restarted while the job trains: the learner's
# incarnation ends and a new one rejoins (about 2 minutes). Skipped (77) as netns_chaos is.
add_test(NAME netns_two_host COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/cluster/netns_two_host_test.sh)
set_tests_properties(netns_two_host PROPERTIES LABELS cluster SKIP_RETURN_CODE 77 TIMEOUT 300 PROCESSORS 3
  ENVIRONMENT "DILOCO_BIN=${PROJECT_BINARY_DIR}/bin")

# The example Prometheus configs of configs/wan-example pass Prometheus's own checker. Skipped
# (77) without promtool (Debian's prometheus package; scripts/setup.sh installs it).
add_test(NAME prometheus_example_configs COMMAND sh -c
  "command -v promtool >/dev/null || { echo 'promtool is not installed (Debian package prometheus): skipped'; exit 77; }; \
   promtool check config ${PROJECT_SOURCE_DIR}/configs/wan-example/prometheus-site.yml && \
   promtool check config ${PROJECT_SOURCE_DIR}/configs/wan-example/prometheus-central.yml")
set_tests_properties(prometheus_example_configs PROPERTIES SKIP_RETURN_CODE 77)
