# Tests of daemon/report: the run-directory loader, the SVG writer, the page, and
# `dilococtl report` end to end (rendered by headless Chromium when installed).
diloco_test(report_tests
  report/test_svg_plot.cpp
  report/test_run_data.cpp
  report/test_report_e2e.cpp
)
target_link_libraries(report_tests PRIVATE diloco_report)
add_dependencies(report_tests dilococtl)
