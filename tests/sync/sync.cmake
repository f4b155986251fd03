diloco_test(sync_tests
  sync/test_decide.cpp
  sync/test_event_log.cpp
  sync/test_fold.cpp
  sync/test_fragments.cpp
  sync/test_global_state.cpp
  sync/test_goodput.cpp
  sync/test_goodput_builder.cpp
  sync/test_merge.cpp
  sync/test_merger.cpp
  sync/test_round_book.cpp
  sync/test_shards.cpp
  sync/test_syncer_core.cpp
  sync/test_update_log.cpp
)
target_link_libraries(sync_tests PRIVATE diloco_sync diloco_syncer)
# test_update_log replays with the real codecs.
target_link_libraries(sync_tests PRIVATE diloco_net)
