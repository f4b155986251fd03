// A small SVG chart writer for `dilococtl report`: line/point plots, grouped bars and
// horizontal timelines, each a self-contained <svg> element (no scripts, no fonts, no
// external references) with axes, ticks, labels and a legend. Pure functions of their
// inputs, so the same data always gives the same bytes.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace diloco {

// Escapes text for an XML/HTML element body or a double-quoted attribute.
std::string EscapeXml(const std::string& text);

// The colour of series i (cycles through a palette that reads on white).
std::string PaletteColour(int i);

// Geometry shared by every chart: the plot area is the rectangle
// [kPlotLeft, kPlotLeft + kPlotWidth] x [kPlotTop, kPlotTop + kPlotHeight];
// the legend sits to its right.
constexpr double kSvgWidth = 1100;
constexpr double kSvgHeight = 400;
constexpr double kPlotLeft = 80;
constexpr double kPlotTop = 40;
constexpr double kPlotWidth = 760;
constexpr double kPlotHeight = 300;

// A linear map from a data interval onto a pixel interval.
struct Scale {
  double lo = 0, hi = 1;  // data
  double pixel_lo = 0, pixel_hi = 1;
  double Map(double v) const;
};

// About `count` round tick values covering [lo, hi] (steps of 1, 2 or 5 x 10^k).
std::vector<double> NiceTicks(double lo, double hi, int count);

enum class SeriesStyle { kLine, kDashedLine, kPoints };

struct Series {
  std::string name;    // legend text; empty: not in the legend
  std::string colour;  // e.g. "#1f77b4"
  SeriesStyle style = SeriesStyle::kLine;
  double stroke_width = 2;
  double opacity = 1;
  std::vector<std::pair<double, double>> points;  // (x, y); non-finite points are skipped
};

struct LinePlot {
  std::string title, x_label, y_label;
  std::vector<Series> series;
  // Fixed axis ranges; lo == hi means "fit the data".
  double x_lo = 0, x_hi = 0, y_lo = 0, y_hi = 0;
  bool log_y = false;  // y on a log10 axis (values <= 0 are not drawn)
};

// A line/point plot as one <svg> element. An empty plot still draws its frame.
std::string RenderLinePlot(const LinePlot& plot);

// Grouped vertical bars: one group per category, one bar per series in each group.
struct BarChart {
  std::string title, x_label, y_label;
  std::vector<std::string> categories;
  std::vector<std::string> series_names;
  std::vector<std::string> series_colours;
  std::vector<std::vector<double>> values;  // [series][category]; non-finite: no bar
  double y_hi = 0;                          // 0: fit the data
};

std::string RenderBarChart(const BarChart& chart);

// Horizontal rows of coloured segments over a shared x axis (e.g. wall time).
struct TimelineSegment {
  double x0 = 0, x1 = 0;
  int kind = 0;  // index into Timeline::kind_names / kind_colours
};
struct TimelineRow {
  std::string label;
  std::vector<TimelineSegment> segments;
};
struct Timeline {
  std::string title, x_label;
  std::vector<std::string> kind_names;
  std::vector<std::string> kind_colours;
  std::vector<TimelineRow> rows;
};

std::string RenderTimeline(const Timeline& timeline);

}  // namespace diloco
