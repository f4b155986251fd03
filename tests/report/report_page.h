// Shared by the report's end-to-end tests: run a command, check a written page
// (every panel drawn, well formed, nothing fetched), and render it in headless
// Chromium when installed.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "daemon/report/html_report.h"
#include "tests/report/xml_check.h"

namespace diloco::testing {

inline std::string ReadFile(const std::filesystem::path &p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Runs a shell command in dir (stdout and stderr to <log>.out and <log>.err
// there); returns its exit code.
inline int Shell(const std::filesystem::path &dir, const std::string &cmd, const std::string &log) {
  const std::string full = "cd '" + dir.string() + "' && " + cmd + " > " + log + ".out 2> " + log + ".err";
  const int rc = std::system(full.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// Every panel is there and draws (the table: a table; the others: at least one
// chart), the page and each SVG are well formed, and nothing is fetched.
inline void CheckEveryPanelDrawn(const std::string &page) {
  CHECK(XmlProblem(page, true) == "");
  for (const std::string &id : ReportPanelIds()) {
    const size_t at = page.find("<section id=\"" + id + "\"");
    REQUIRE(at != std::string::npos);
    const std::string section = page.substr(at, page.find("</section>", at) - at);
    INFO(id);
    CHECK(section.find(id == "summary" ? "<table>" : "<svg") != std::string::npos);
  }
  for (const std::string &svg : SvgElements(page)) CHECK(XmlProblem(svg) == "");
  CHECK(page.find("<script") == std::string::npos);
  CHECK(page.find("http://") == page.find("http://www.w3.org/2000/svg"));  // only the SVG namespace
  CHECK(page.find("https://") == std::string::npos);
}

// Where chromium is, or "".
inline std::string FindChromium() {
  for (const char *p : {"/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"})
    if (access(p, X_OK) == 0) return p;
  return "";
}

// Renders dir/<html> to dir/<name>.png in headless Chromium and checks it loaded
// without errors and drew a page. Skips (with a warning) where Chromium is
// missing. DILOCO_REPORT_PNG_DIR=dir keeps a copy of the PNG for a person.
inline void RenderInChromium(const std::filesystem::path &dir, const std::string &html, const std::string &name) {
  const std::string chromium = FindChromium();
  if (chromium.empty()) {
    WARN("SKIP: chromium is not installed (apt-get install chromium, or scripts/setup.sh); " + html +
         " was not rendered");
    return;
  }
  const std::filesystem::path png = dir / (name + ".png");
  // Its own profile directory: two Chromiums at the same time must not share one.
  const int rc = Shell(dir,
                       "timeout 120 " + chromium +
                           " --headless --no-sandbox --disable-gpu --disable-background-networking --no-first-run"
                           " --user-data-dir=profile-" + name + " --enable-logging=stderr --v=0 --screenshot=" +
                           png.string() + " --window-size=1400,4200 'file://" + (dir / html).string() + "'",
                       "chrome-" + name);
  const std::string log = ReadFile(dir / ("chrome-" + name + ".err")) + ReadFile(dir / ("chrome-" + name + ".out"));
  INFO(log);
  REQUIRE(rc == 0);
  REQUIRE(std::filesystem::exists(png));
  CHECK(std::filesystem::file_size(png) > 50 * 1024);  // a blank page of this size is a few KiB
  CHECK(log.find("Uncaught") == std::string::npos);
  CHECK(log.find(":CONSOLE") == std::string::npos);
  if (const char *keep = std::getenv("DILOCO_REPORT_PNG_DIR")) {
    std::filesystem::copy_file(png, std::filesystem::path(keep) / (name + ".png"),
                               std::filesystem::copy_options::overwrite_existing);
  }
}

}  // namespace diloco::testing
