// The page of `dilococtl report`: one self-contained HTML file (inline SVG, inline CSS,
// no scripts, nothing fetched) with the runs overlaid in eight panels: loss vs tokens,
// loss vs wall time, goodput/uptime and merges over time, per-learner timeline, bytes
// over time, contributors per merge, staleness histogram and a summary table. A panel
// the data cannot fill says what was missing instead.
#pragma once

#include <string>
#include <vector>

#include "daemon/report/run_data.h"
#include "daemon/util/status.h"

namespace diloco {

// A gap between two metrics lines longer than this many times the learner's median
// time per step counts as down or blocked in the timeline.
constexpr double kTimelineGapFactor = 3.0;

// The ids of the panels' <svg> wrappers, in page order (tests look for them).
const std::vector<std::string>& ReportPanelIds();

std::string RenderHtmlReport(const std::vector<RunData>& runs);

// Renders and writes the page to path (atomically: a reader never sees half a page).
Status WriteHtmlReport(const std::vector<RunData>& runs, const std::string& path);

}  // namespace diloco
