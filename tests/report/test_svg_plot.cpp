#include <catch2/catch.hpp>
#include <limits>

#include "daemon/report/svg_plot.h"
#include "tests/report/xml_check.h"

namespace diloco {
namespace {

using testing::XmlProblem;

LinePlot UnitPlot() {
  // Aggregate init: assigning one-letter literals trips GCC 12's false
  // -Wrestrict.
  LinePlot plot{"t", "x", "y", {}};
  plot.x_lo = 0, plot.x_hi = 10, plot.y_lo = 0, plot.y_hi = 1;
  plot.series.push_back({"a", "#123456", SeriesStyle::kLine, 2, 1, {{0, 0}, {5, 0.5}, {10, 1}}});
  return plot;
}

}  // namespace

TEST_CASE("EscapeXml escapes markup and drops control characters", "[unit]") {
  CHECK(EscapeXml("<a href=\"x\">&'</a>") == "&lt;a href=&quot;x&quot;&gt;&amp;&#39;&lt;/a&gt;");
  CHECK(EscapeXml(std::string("a\x01"
                              "b")) == "a b");
  CHECK(EscapeXml("plain") == "plain");
}

TEST_CASE("NiceTicks gives round steps that cover the range", "[unit]") {
  const std::vector<double> t = NiceTicks(0, 1, 5);
  REQUIRE(t.size() == 6);
  CHECK(t.front() == Approx(0));
  CHECK(t[1] == Approx(0.2));
  CHECK(t.back() == Approx(1));
  CHECK(NiceTicks(3, 3, 5).empty());
  CHECK(NiceTicks(0, std::numeric_limits<double>::infinity(), 5).empty());
  for (double v : NiceTicks(13, 87, 8)) CHECK((v >= 13 && v <= 87));
}

TEST_CASE("A line plot maps data onto the plot area", "[unit]") {
  const std::string svg = RenderLinePlot(UnitPlot());
  INFO(svg);
  CHECK(XmlProblem(svg) == "");
  // x: 0..10 onto [80, 840]; y: 0..1 onto [340, 40] (up is smaller y).
  CHECK(svg.find("points=\"80.00,340.00 460.00,190.00 840.00,40.00\"") != std::string::npos);
  CHECK(svg.find(">a</text>") != std::string::npos);  // legend
  CHECK(svg.find(">t</text>") != std::string::npos);  // title
  const Scale s{0, 10, kPlotLeft, kPlotLeft + kPlotWidth};
  CHECK(s.Map(2.5) == Approx(kPlotLeft + kPlotWidth / 4));
}

TEST_CASE("A log axis maps decades evenly and drops values it cannot show", "[unit]") {
  LinePlot plot{"t", "x", "y", {}};
  plot.x_lo = 0, plot.x_hi = 10, plot.y_lo = 1, plot.y_hi = 1000, plot.log_y = true;
  plot.series.push_back({"a", "#123456", SeriesStyle::kLine, 2, 1, {{0, 0}, {0, 1}, {5, 10}, {10, 1000}}});
  const std::string svg = RenderLinePlot(plot);
  INFO(svg);
  CHECK(XmlProblem(svg) == "");
  // 1, 10, 1000 over three decades: 10 is a third of the way up; 0 is not
  // drawn.
  CHECK(svg.find("points=\"80.00,340.00 460.00,240.00 840.00,40.00\"") != std::string::npos);
  CHECK(svg.find(">1000</text>") != std::string::npos);
}

TEST_CASE("A line plot skips non-finite points and survives empty or flat data", "[unit]") {
  LinePlot plot = UnitPlot();
  plot.series[0].points.push_back({std::numeric_limits<double>::quiet_NaN(), 1});
  CHECK(RenderLinePlot(plot).find("NaN") == std::string::npos);
  CHECK(RenderLinePlot(plot).find("nan") == std::string::npos);

  LinePlot empty;
  CHECK(XmlProblem(RenderLinePlot(empty)) == "");
  LinePlot flat;
  flat.series.push_back({"", "#000", SeriesStyle::kPoints, 1, 1, {{1, 2}, {1, 2}}});
  const std::string svg = RenderLinePlot(flat);
  CHECK(XmlProblem(svg) == "");
  CHECK(svg.find("<circle") != std::string::npos);
  CHECK(svg.find("nan") == std::string::npos);
}

TEST_CASE("Labels with markup are escaped in every chart", "[unit]") {
  LinePlot plot = UnitPlot();
  plot.title = "<script>alert(1)</script>";
  plot.series[0].name = "a & b";
  const std::string svg = RenderLinePlot(plot);
  CHECK(XmlProblem(svg) == "");
  CHECK(svg.find("<script") == std::string::npos);
  CHECK(svg.find("a &amp; b") != std::string::npos);

  BarChart bars;
  bars.categories = {"<x>"};
  bars.series_names = {"\"q\""};
  bars.values = {{1}};
  CHECK(XmlProblem(RenderBarChart(bars)) == "");

  Timeline tl;
  tl.kind_names = {"k<"};
  tl.kind_colours = {"#0f0"};
  tl.rows.push_back({"r&", {{0, 1, 0}}});
  CHECK(XmlProblem(RenderTimeline(tl)) == "");
}

TEST_CASE("Bar heights and timeline segments land where the values say", "[unit]") {
  BarChart bars;
  bars.categories = {"a", "b"};
  bars.series_names = {"s"};
  bars.series_colours = {"#111111"};
  bars.values = {{0.5, std::numeric_limits<double>::quiet_NaN()}};
  bars.y_hi = 1;
  const std::string svg = RenderBarChart(bars);
  INFO(svg);
  // 0.5 of 1 is half of the 300 px plot height, from the bottom at 340; a NaN
  // draws no bar.
  CHECK(svg.find("y=\"190.00\" width=") != std::string::npos);
  CHECK(svg.find("height=\"150.00\" fill=\"#111111\"") != std::string::npos);
  size_t bars_drawn = 0;
  for (size_t p = svg.find("fill=\"#111111\""); p != std::string::npos; p = svg.find("fill=\"#111111\"", p + 1))
    ++bars_drawn;
  CHECK(bars_drawn == 2);  // one bar, one legend swatch

  Timeline tl;
  tl.kind_names = {"on", "off"};
  tl.kind_colours = {"#00ff00", "#ff0000"};
  tl.rows.push_back({"L0", {{0, 5, 0}, {5, 10, 1}}});
  const std::string t = RenderTimeline(tl);
  CHECK(XmlProblem(t) == "");
  // Rows start after the label column at 140 and end at 840: 5 of 10 is x =
  // 490.
  CHECK(t.find("<rect x=\"490.00\"") != std::string::npos);
  CHECK(t.find("fill=\"#ff0000\"") != std::string::npos);
}

}  // namespace diloco
