# Tests of daemon/export: the safetensors reader/writer and the export of real
# run directories (checked again by python3's json module when present).
diloco_test(export_tests
  export/test_safetensors.cpp
  export/test_export.cpp
)
target_link_libraries(export_tests PRIVATE diloco_export nlohmann_json::nlohmann_json)
