target_sources(diloco_net PRIVATE ${CMAKE_CURRENT_LIST_DIR}/codec.cpp)
