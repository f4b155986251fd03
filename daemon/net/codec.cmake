target_sources(diloco_net PRIVATE ${CMAKE_CURRENT_LIST_DIR}/codec.cpp)
# The dense codecs are the engine's sync ops (kernels/sync_ops.h).
target_link_libraries(diloco_net PUBLIC diloco_kernels)
