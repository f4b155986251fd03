// End-to-end: two tiny runs trained by the real dilococtl (decoupled and ddp),
// one report over both, every panel drawn, and the page rendered by headless
// Chromium when installed.
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
#include "tests/temp_dir.h"

namespace diloco {
namespace {

namespace fs = std::filesystem;

std::string ReadFile(const fs::path &p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Runs a shell command in dir (stdout and stderr to files there); returns its
// exit code.
int Shell(const fs::path &dir, const std::string &cmd, const std::string &log) {
  const std::string full = "cd '" + dir.string() + "' && " + cmd + " > " + log + ".out 2> " + log + ".err";
  const int rc = std::system(full.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

const std::string kDilococtl = DILOCO_BINARY_DIR "/bin/dilococtl";

// A tiny model on a small corpus: two learners, 200 steps each, well under a
// second.
void WriteTinyRun(const testing::TempDir &dir) {
  std::string corpus;
  for (int i = 0; i < 300; i++)
    corpus += "Line " + std::to_string(i) + ": the quick brown fox jumps over the lazy dog, again and again.\n";
  dir.Write("corpus.txt", corpus);
  dir.Write("run.yaml",
            "model: {n_layer: 1, n_embd: 32, n_head: 2, block_size: 32}\n"
            "data: {corpus: corpus.txt}\n"
            "train: {batch_size: 4, steps: 200, warmup_steps: 5, threads: 1, "
            "log_every: 10}\n"
            "eval: {every: 100, batches: 2}\n"
            "sync: {learners: 2, inner_steps: 20}\n");
}

// Where chromium is, or "" (the test then skips its rendering part).
std::string FindChromium() {
  for (const char *p : {"/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"})
    if (access(p, X_OK) == 0) return p;
  return "";
}

}  // namespace

TEST_CASE("dilococtl report overlays a decoupled and a ddp run", "[e2e]") {
  testing::TempDir dir;
  WriteTinyRun(dir);
  REQUIRE(Shell(dir.path(), kDilococtl + " train run.yaml --out dec", "dec") == 0);
  REQUIRE(Shell(dir.path(), kDilococtl + " train run.yaml --set sync.mode=ddp --out ddp", "ddp") == 0);
  REQUIRE(fs::exists(dir.path() / "dec/events.log"));

  const int rc = Shell(dir.path(), kDilococtl + " report dec ddp -o report.html --label decoupled --label ddp", "rep");
  INFO(ReadFile(dir.path() / "rep.err"));
  REQUIRE(rc == 0);
  const std::string page = ReadFile(dir.path() / "report.html");
  CHECK(testing::XmlProblem(page, true) == "");
  // Every panel but the table draws at least one chart.
  for (const std::string &id : ReportPanelIds()) {
    const size_t at = page.find("<section id=\"" + id + "\"");
    REQUIRE(at != std::string::npos);
    const std::string section = page.substr(at, page.find("</section>", at) - at);
    INFO(id);
    CHECK(section.find(id == "summary" ? "<table>" : "<svg") != std::string::npos);
  }
  for (const std::string &svg : testing::SvgElements(page)) CHECK(testing::XmlProblem(svg) == "");
  CHECK(page.find("ddp: no events.log") != std::string::npos);  // said plainly, not silently missing
  CHECK(page.find("<script") == std::string::npos);
  CHECK(page.find("http://") == page.find("http://www.w3.org/2000/svg"));  // only the SVG namespace

  // A directory that does not exist is an error, exit 1, and names the
  // directory.
  CHECK(Shell(dir.path(), kDilococtl + " report dec missing-dir -o bad.html", "missing") == 1);
  CHECK(ReadFile(dir.path() / "missing.err").find("missing-dir") != std::string::npos);
  CHECK_FALSE(fs::exists(dir.path() / "bad.html"));

  const std::string chromium = FindChromium();
  if (chromium.empty()) {
    WARN(
        "SKIP: chromium is not installed (apt-get install chromium); the page "
        "was not rendered");
    return;
  }
  // Its own profile directory: a second Chromium at the same time must not
  // share one.
  const int chrome_rc = Shell(dir.path(),
                              "timeout 120 " + chromium +
                                  " --headless --no-sandbox --disable-gpu "
                                  "--disable-background-networking"
                                  " --no-first-run --user-data-dir=profile "
                                  "--enable-logging=stderr --v=0"
                                  " --screenshot=" +
                                  (dir.path() / "report.png").string() + " --window-size=1400,4000 file://" +
                                  (dir.path() / "report.html").string(),
                              "chrome");
  const std::string chrome_log = ReadFile(dir.path() / "chrome.err") + ReadFile(dir.path() / "chrome.out");
  INFO(chrome_log);
  REQUIRE(chrome_rc == 0);
  REQUIRE(fs::exists(dir.path() / "report.png"));
  CHECK(fs::file_size(dir.path() / "report.png") > 50 * 1024);
  CHECK(chrome_log.find("Uncaught") == std::string::npos);
  CHECK(chrome_log.find(":CONSOLE") == std::string::npos);
  // For a person to look at: DILOCO_REPORT_PNG=path keeps a copy.
  if (const char *keep = std::getenv("DILOCO_REPORT_PNG"))
    fs::copy_file(dir.path() / "report.png", keep, fs::copy_options::overwrite_existing);
}

}  // namespace diloco
