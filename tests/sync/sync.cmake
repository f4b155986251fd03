diloco_test(sync_tests
  sync/test_decide.cpp
  sync/test_event_log.cpp
  sync/test_fold.cpp
  sync/test_fragments.cpp
  sync/test_global_state.cpp
  sync/test_merge.cpp
)
target_link_libraries(sync_tests PRIVATE diloco_sync)
