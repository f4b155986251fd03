# Tests of daemon/export: the safetensors reader/writer and the export of real
# run directories (checked again by python3's json module when present).
diloco_test(export_tests
  export/test_safetensors.cpp
  export/test_export.cpp
)
target_link_libraries(export_tests PRIVATE diloco_export nlohmann_json::nlohmann_json)

# The systemd unit (scripts/dilocod@.service) passes `systemd-analyze verify`
# without a single warning; only where systemd-analyze exists at configure time.
find_program(DILOCO_SYSTEMD_ANALYZE systemd-analyze)
if(DILOCO_SYSTEMD_ANALYZE)
  add_test(NAME unit_file_verify COMMAND ${PROJECT_SOURCE_DIR}/scripts/check-unit.sh
                                         ${PROJECT_SOURCE_DIR}/scripts/dilocod@.service)
  set_tests_properties(unit_file_verify PROPERTIES LABELS unit-file TIMEOUT 60)
endif()
