# Wire format: envelope.{h,cpp} (FlatBuffers envelope, framing, ParseEnvelope, snapshots) and
# codec_kind.h (shared codec sizes). Generated schema code comes from proto/ (diloco_proto).
target_sources(diloco_net PRIVATE ${CMAKE_CURRENT_LIST_DIR}/envelope.cpp)
target_link_libraries(diloco_net PUBLIC diloco_proto)
