# Wire format: envelope.{h,cpp} (FlatBuffers envelope, framing, BuildMessage, ParseEnvelope),
# envelope_checks (field checks), message_checks (one check per message), envelope_chunks
# (payload frames), snapshot_assembler, and codec_kind.h (shared codec sizes). Generated schema
# code (FlatBuffers, message structs and their read/write) comes from proto/ (diloco_proto).
target_sources(diloco_net PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/envelope.cpp
  ${CMAKE_CURRENT_LIST_DIR}/envelope_checks.cpp
  ${CMAKE_CURRENT_LIST_DIR}/envelope_chunks.cpp
  ${CMAKE_CURRENT_LIST_DIR}/message_checks.cpp
  ${CMAKE_CURRENT_LIST_DIR}/snapshot_assembler.cpp)
target_link_libraries(diloco_net PUBLIC diloco_proto)
