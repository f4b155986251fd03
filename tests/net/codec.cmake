diloco_test(net_codec_tests ${CMAKE_CURRENT_LIST_DIR}/test_codec.cpp)
target_link_libraries(net_codec_tests PRIVATE diloco_net)
