# The virtual runtime (daemon/virt): its clock and link, and whole virtual runs.
diloco_test(virt_tests
  virt/test_virtual_clock.cpp
  virt/test_virtual_run.cpp
)
target_link_libraries(virt_tests PRIVATE diloco_train nlohmann_json::nlohmann_json)

# Deterministic simulation testing over 500 seeds (issue 30: CI runs >= 500 in under 2 minutes on
# a quiet machine; `scripts/dst.sh` runs 100,000). A failing seed prints its replay command.
add_test(NAME dst_500_seeds COMMAND dilococtl dst --seeds 500)
set_tests_properties(dst_500_seeds PROPERTIES TIMEOUT 900 LABELS dst)
