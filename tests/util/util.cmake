# Tests of daemon/util (test_crc32c.cpp is part of train_tests).
diloco_test(util_tests
  util/test_jsonl_writer.cpp
  util/test_lock_file.cpp
  util/test_sd_notify.cpp
  util/test_status.cpp
  util/test_log.cpp
  util/test_ring_interface.cpp
)
target_link_libraries(util_tests PRIVATE diloco_util)
