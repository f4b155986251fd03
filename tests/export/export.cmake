# Tests of daemon/export: the safetensors reader/writer, opening and evaluating trained models,
# and the export of real run directories (checked again by python3's json module when present).
diloco_test(export_tests
  export/test_safetensors.cpp
  export/test_export.cpp
  export/test_model_eval.cpp
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

# The exports load in PyTorch as they are (both layouts, strict load_state_dict) and reproduce
# `dilococtl eval --full` to 1e-4 relative. Skipped (77) where /usr/bin/python3 or its torch is
# missing (Debian's python3-torch).
add_test(NAME torch_load_export
         COMMAND sh -c "test -x /usr/bin/python3 || { echo 'SKIP: no /usr/bin/python3 (Debian python3-torch)'; exit 77; }; exec /usr/bin/python3 \"$0\" \"$@\""
                 ${CMAKE_CURRENT_SOURCE_DIR}/export/torch_load_export.py $<TARGET_FILE:dilococtl> ${CMAKE_CURRENT_BINARY_DIR})
set_tests_properties(torch_load_export PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 120 LABELS torch)
