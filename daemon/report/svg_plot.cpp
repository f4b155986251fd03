#include "daemon/report/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace diloco {
namespace {

constexpr double kLegendLeft = kPlotLeft + kPlotWidth + 20;
constexpr double kLegendRowPx = 18;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Numbers in SVG attributes: fixed precision keeps the output stable and small.
std::string Px(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

// Tick labels: short, without trailing zeros; large values with k/M/G.
std::string TickLabel(double v) {
  char buf[32];
  const double a = std::fabs(v);
  if (a >= 1e9) {
    std::snprintf(buf, sizeof buf, "%gG", v / 1e9);
  } else if (a >= 1e6) {
    std::snprintf(buf, sizeof buf, "%gM", v / 1e6);
  } else if (a >= 1e4) {
    std::snprintf(buf, sizeof buf, "%gk", v / 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%.4g", std::fabs(v) < 1e-12 ? 0.0 : v);
  }
  return buf;
}

std::string Text(double x, double y, const std::string& text, const char* anchor, int size_px,
                 const std::string& extra = "") {
  return "<text x=\"" + Px(x) + "\" y=\"" + Px(y) + "\" text-anchor=\"" + anchor + "\" font-size=\"" +
         std::to_string(size_px) + "\"" + extra + ">" + EscapeXml(text) + "</text>\n";
}

std::string Open(double width, double height) {
  return "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + Px(width) + "\" height=\"" + Px(height) +
         "\" viewBox=\"0 0 " + Px(width) + " " + Px(height) +
         "\" font-family=\"sans-serif\">\n<rect x=\"0\" y=\"0\" width=\"" + Px(width) + "\" height=\"" + Px(height) +
         "\" fill=\"white\"/>\n";
}

// Title, frame and axis labels around the standard plot area.
std::string Frame(const std::string& title, const std::string& x_label, const std::string& y_label,
                  double plot_height) {
  std::string s = Text(kPlotLeft, 22, title, "start", 15, " font-weight=\"bold\"");
  s += "<rect x=\"" + Px(kPlotLeft) + "\" y=\"" + Px(kPlotTop) + "\" width=\"" + Px(kPlotWidth) + "\" height=\"" +
       Px(plot_height) + "\" fill=\"none\" stroke=\"#444\"/>\n";
  s += Text(kPlotLeft + kPlotWidth / 2, kPlotTop + plot_height + 42, x_label, "middle", 13);
  if (!y_label.empty()) {
    const double cy = kPlotTop + plot_height / 2;
    s += Text(18, cy, y_label, "middle", 13, " transform=\"rotate(-90 18 " + Px(cy) + ")\"");
  }
  return s;
}

std::string XTicks(const Scale& x, double plot_bottom) {
  std::string s;
  for (double t : NiceTicks(x.lo, x.hi, 8)) {
    const double px = x.Map(t);
    s += "<line x1=\"" + Px(px) + "\" y1=\"" + Px(plot_bottom) + "\" x2=\"" + Px(px) + "\" y2=\"" +
         Px(plot_bottom + 5) + "\" stroke=\"#444\"/>\n";
    s += Text(px, plot_bottom + 19, TickLabel(t), "middle", 11);
  }
  return s;
}

// On a log axis the scale runs over log10 values and ticks sit at whole decades.
std::string YTicks(const Scale& y, bool log = false) {
  std::string s;
  std::vector<double> ticks;
  if (log) {
    for (double e = std::ceil(y.lo); e <= y.hi; e += 1) ticks.push_back(e);
  } else {
    ticks = NiceTicks(y.lo, y.hi, 6);
  }
  for (double t : ticks) {
    const double py = y.Map(t);
    s += "<line x1=\"" + Px(kPlotLeft) + "\" y1=\"" + Px(py) + "\" x2=\"" + Px(kPlotLeft + kPlotWidth) + "\" y2=\"" +
         Px(py) + "\" stroke=\"#e4e4e4\"/>\n";
    s += Text(kPlotLeft - 6, py + 4, TickLabel(log ? std::pow(10.0, t) : t), "end", 11);
  }
  return s;
}

// One legend row: a swatch (line or square) and the name.
std::string LegendRow(int row, const std::string& name, const std::string& colour, bool square, bool dashed) {
  const double y = kPlotTop + 8 + row * kLegendRowPx;
  std::string s;
  if (square) {
    s += "<rect x=\"" + Px(kLegendLeft) + "\" y=\"" + Px(y - 5) + "\" width=\"14\" height=\"10\" fill=\"" +
         EscapeXml(colour) + "\"/>\n";
  } else {
    s += "<line x1=\"" + Px(kLegendLeft) + "\" y1=\"" + Px(y) + "\" x2=\"" + Px(kLegendLeft + 18) + "\" y2=\"" + Px(y) +
         "\" stroke=\"" + EscapeXml(colour) + "\" stroke-width=\"3\"" + (dashed ? " stroke-dasharray=\"5 3\"" : "") +
         "/>\n";
  }
  s += Text(kLegendLeft + 24, y + 4, name, "start", 12);
  return s;
}

// Widens a degenerate or empty range so the map stays finite.
void FitRange(double* lo, double* hi) {
  if (!std::isfinite(*lo) || !std::isfinite(*hi)) {
    *lo = 0;
    *hi = 1;
  } else if (*hi - *lo <= 0) {
    const double pad = *lo == 0 ? 1 : std::fabs(*lo) * 0.05;
    *lo -= pad;
    *hi += pad;
  }
}

}  // namespace

std::string EscapeXml(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        // Control characters are not allowed in XML 1.0 text.
        if (static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t') {
          out += ' ';
        } else {
          out += c;
        }
    }
  }
  return out;
}

std::string PaletteColour(int i) {
  static const char* kColours[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                   "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  const int n = sizeof kColours / sizeof kColours[0];
  return kColours[((i % n) + n) % n];
}

double Scale::Map(double v) const {
  if (hi == lo) return (pixel_lo + pixel_hi) / 2;
  return pixel_lo + (v - lo) / (hi - lo) * (pixel_hi - pixel_lo);
}

std::vector<double> NiceTicks(double lo, double hi, int count) {
  std::vector<double> ticks;
  if (!std::isfinite(lo) || !std::isfinite(hi) || hi <= lo || count < 1) return ticks;
  const double raw = (hi - lo) / count;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * mag;
    if (step >= raw) break;
  }
  // Small epsilon so a tick that equals hi up to rounding is kept.
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push_back(t);
  return ticks;
}

std::string RenderLinePlot(const LinePlot& plot) {
  // y in axis units (log10 on a log axis; NaN where a log axis cannot show it).
  auto ty = [&](double v) { return !plot.log_y ? v : v > 0 ? std::log10(v) : kNaN; };
  double x_lo = plot.x_lo, x_hi = plot.x_hi, y_lo = ty(plot.y_lo), y_hi = ty(plot.y_hi);
  const bool fit_x = plot.x_lo == plot.x_hi, fit_y = plot.y_lo == plot.y_hi;
  if (fit_x || fit_y) {
    double a = std::numeric_limits<double>::infinity(), b = -a, c = a, d = -a;
    for (const Series& s : plot.series) {
      for (auto [x, raw_y] : s.points) {
        const double y = ty(raw_y);
        if (!std::isfinite(x) || !std::isfinite(y)) continue;
        a = std::min(a, x), b = std::max(b, x), c = std::min(c, y), d = std::max(d, y);
      }
    }
    if (fit_x) x_lo = a, x_hi = b;
    if (fit_y) {
      // A little headroom so lines do not run along the frame.
      const double pad = (d - c) * 0.05;
      y_lo = c - pad, y_hi = d + pad;
    }
  }
  FitRange(&x_lo, &x_hi);
  FitRange(&y_lo, &y_hi);
  if (plot.log_y && fit_y) {
    // Whole decades, so the axis always has ticks.
    y_lo = std::floor(y_lo), y_hi = std::max(std::ceil(y_hi), y_lo + 1);
  }
  const Scale x{x_lo, x_hi, kPlotLeft, kPlotLeft + kPlotWidth};
  const Scale y{y_lo, y_hi, kPlotTop + kPlotHeight, kPlotTop};

  std::string s = Open(kSvgWidth, kSvgHeight);
  s += YTicks(y, plot.log_y);
  s += Frame(plot.title, plot.x_label, plot.y_label, kPlotHeight);
  s += XTicks(x, kPlotTop + kPlotHeight);
  int legend_row = 0;
  for (const Series& series : plot.series) {
    const std::string colour = EscapeXml(series.colour);
    const std::string opacity = series.opacity < 1 ? " opacity=\"" + Px(series.opacity) + "\"" : "";
    if (series.style == SeriesStyle::kPoints) {
      for (auto [px, raw_py] : series.points) {
        const double py = ty(raw_py);
        if (!std::isfinite(px) || !std::isfinite(py)) continue;
        s += "<circle cx=\"" + Px(x.Map(px)) + "\" cy=\"" + Px(y.Map(py)) + "\" r=\"4\" fill=\"" + colour +
             "\" stroke=\"black\" stroke-width=\"0.7\"" + opacity + "/>\n";
      }
    } else {
      std::string pts;
      for (auto [px, raw_py] : series.points) {
        const double py = ty(raw_py);
        if (!std::isfinite(px) || !std::isfinite(py)) continue;
        if (!pts.empty()) pts += ' ';
        pts += Px(x.Map(px));
        pts += ',';
        pts += Px(y.Map(py));
      }
      if (!pts.empty()) {
        s += "<polyline fill=\"none\" stroke=\"" + colour + "\" stroke-width=\"" + Px(series.stroke_width) + "\"" +
             (series.style == SeriesStyle::kDashedLine ? " stroke-dasharray=\"6 4\"" : "") + opacity + " points=\"" +
             pts + "\"/>\n";
      }
    }
    if (!series.name.empty()) {
      s += LegendRow(legend_row++, series.name, series.colour, series.style == SeriesStyle::kPoints,
                     series.style == SeriesStyle::kDashedLine);
    }
  }
  s += "</svg>\n";
  return s;
}

std::string RenderBarChart(const BarChart& chart) {
  double hi = chart.y_hi;
  if (hi <= 0) {
    for (const auto& row : chart.values)
      for (double v : row)
        if (std::isfinite(v)) hi = std::max(hi, v * 1.05);
  }
  if (hi <= 0) hi = 1;
  const Scale y{0, hi, kPlotTop + kPlotHeight, kPlotTop};
  std::string s = Open(kSvgWidth, kSvgHeight);
  s += YTicks(y);
  s += Frame(chart.title, chart.x_label, chart.y_label, kPlotHeight);
  const size_t n_cat = std::max<size_t>(chart.categories.size(), 1);
  const size_t n_ser = std::max<size_t>(chart.values.size(), 1);
  const double group_px = kPlotWidth / n_cat;
  const double bar_px = group_px * 0.8 / n_ser;
  for (size_t c = 0; c < chart.categories.size(); ++c) {
    const double group_left = kPlotLeft + c * group_px + group_px * 0.1;
    for (size_t k = 0; k < chart.values.size(); ++k) {
      if (c >= chart.values[k].size() || !std::isfinite(chart.values[k][c])) continue;
      const double v = std::clamp(chart.values[k][c], 0.0, hi);
      const double top = y.Map(v);
      const std::string colour = k < chart.series_colours.size() ? chart.series_colours[k] : PaletteColour(int(k));
      s += "<rect x=\"" + Px(group_left + k * bar_px) + "\" y=\"" + Px(top) + "\" width=\"" + Px(bar_px * 0.95) +
           "\" height=\"" + Px(kPlotTop + kPlotHeight - top) + "\" fill=\"" + EscapeXml(colour) + "\"/>\n";
    }
    s += Text(kPlotLeft + (c + 0.5) * group_px, kPlotTop + kPlotHeight + 19, chart.categories[c], "middle", 11);
  }
  for (size_t k = 0; k < chart.series_names.size(); ++k) {
    const std::string colour = k < chart.series_colours.size() ? chart.series_colours[k] : PaletteColour(int(k));
    s += LegendRow(int(k), chart.series_names[k], colour, true, false);
  }
  s += "</svg>\n";
  return s;
}

std::string RenderTimeline(const Timeline& timeline) {
  constexpr double kRowPx = 22;
  const double plot_height = std::max<double>(kRowPx, timeline.rows.size() * kRowPx);
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const TimelineRow& row : timeline.rows) {
    for (const TimelineSegment& seg : row.segments) {
      if (!std::isfinite(seg.x0) || !std::isfinite(seg.x1)) continue;
      lo = std::min(lo, seg.x0), hi = std::max(hi, seg.x1);
    }
  }
  FitRange(&lo, &hi);
  lo = std::min(lo, 0.0);
  const Scale x{lo, hi, kPlotLeft + 60, kPlotLeft + kPlotWidth};  // room for row labels
  std::string s = Open(kSvgWidth, kPlotTop + plot_height + 60);
  s += Frame(timeline.title, timeline.x_label, "", plot_height);
  s += XTicks(x, kPlotTop + plot_height);
  for (size_t r = 0; r < timeline.rows.size(); ++r) {
    const double top = kPlotTop + r * kRowPx + 3;
    s += Text(kPlotLeft + 56, top + 13, timeline.rows[r].label, "end", 11);
    for (const TimelineSegment& seg : timeline.rows[r].segments) {
      if (!std::isfinite(seg.x0) || !std::isfinite(seg.x1) || seg.kind < 0 ||
          seg.kind >= int(timeline.kind_colours.size()))
        continue;
      const double x0 = x.Map(seg.x0), x1 = x.Map(seg.x1);
      s += "<rect x=\"" + Px(x0) + "\" y=\"" + Px(top) + "\" width=\"" + Px(std::max(0.5, x1 - x0)) + "\" height=\"" +
           Px(kRowPx - 6) + "\" fill=\"" + EscapeXml(timeline.kind_colours[seg.kind]) + "\"/>\n";
    }
  }
  for (size_t k = 0; k < timeline.kind_names.size() && k < timeline.kind_colours.size(); ++k) {
    s += LegendRow(int(k), timeline.kind_names[k], timeline.kind_colours[k], true, false);
  }
  s += "</svg>\n";
  return s;
}

}  // namespace diloco
