// End-to-end: reports of runs made by the real binaries, rendered by headless
// Chromium when installed: two `dilococtl train` runs overlaid, a `dilococtl
// demo` run (three daemons; the demo writes the report itself) and a
// scripts/bench/parity.sh run (the script writes the report beside its table).
#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/report/report_page.h"
#include "tests/temp_dir.h"
#include "tests/text_corpus.h"

namespace diloco {
namespace {

namespace fs = std::filesystem;
using testing::ReadFile;
using testing::Shell;

const std::string kDilococtl = DILOCO_BINARY_DIR "/bin/dilococtl";

// A tiny model on a small corpus: two learners, 200 steps each, well under a
// second.
void WriteTinyRun(const testing::TempDir &dir) {
  dir.Write("corpus.txt", testing::NumberedLines(300));
  dir.Write("run.yaml",
            "model: {n_layer: 1, n_embd: 32, n_head: 2, block_size: 32}\n"
            "data: {corpus: corpus.txt}\n"
            "train: {batch_size: 4, steps: 200, warmup_steps: 5, threads: 1, "
            "log_every: 10}\n"
            "eval: {every: 100, batches: 2}\n"
            "sync: {learners: 2, inner_steps: 20}\n");
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
  testing::CheckEveryPanelDrawn(page);
  CHECK(page.find("ddp: no events.log") != std::string::npos);  // said plainly, not silently missing

  // A directory that does not exist is an error, exit 1, and names the
  // directory.
  CHECK(Shell(dir.path(), kDilococtl + " report dec missing-dir/ -o bad.html", "missing") == 1);
  CHECK(ReadFile(dir.path() / "missing.err").find("missing-dir") != std::string::npos);
  CHECK_FALSE(fs::exists(dir.path() / "bad.html"));
  // So is a name that is neither a directory nor a job of a daemon.
  CHECK(Shell(dir.path(), kDilococtl + " report dec no-such-job --socket nowhere.sock -o bad.html", "nojob") == 1);
  CHECK(ReadFile(dir.path() / "nojob.err").find("'no-such-job' is not a run directory") != std::string::npos);

  testing::RenderInChromium(dir.path(), "report.html", "overlay");
}

TEST_CASE("the demo ends with a report of its job drawn from every site", "[e2e]") {
  testing::TempDir dir;
  WriteTinyRun(dir);
  const int rc = Shell(dir.path(),
                       kDilococtl +
                           " demo --config run.yaml --dir cluster --json --set eval.every=0"
                           " --set 'placement={syncer: site-s, learners: [site-a, site-b]}'",
                       "demo");
  INFO(ReadFile(dir.path() / "demo.err"));
  REQUIRE(rc == 0);
  const std::string out = ReadFile(dir.path() / "demo.out");
  const std::string last_line = out.substr(0, out.find_last_not_of('\n') + 1);
  const nlohmann::json summary = nlohmann::json::parse(last_line.substr(last_line.find_last_of('\n') + 1));
  REQUIRE(summary.value("report", "") == (dir.path() / "cluster/report.html").string());
  const std::string page = ReadFile(dir.path() / "cluster/report.html");
  testing::CheckEveryPanelDrawn(page);
  // Both learners' curves (from site-a's and site-b's run directories) and the
  // merges (site-s's tape) are in it; nothing was missing.
  CHECK(page.find(">L0<") != std::string::npos);
  CHECK(page.find(">L1<") != std::string::npos);
  CHECK(page.find("no events.log") == std::string::npos);
  CHECK(page.find("not readable here") == std::string::npos);
  CHECK(page.find("no summary") == std::string::npos);
  testing::RenderInChromium(dir.path() / "cluster", "report.html", "demo");
}

TEST_CASE("scripts/bench/parity.sh writes a report of its runs beside the table", "[e2e]") {
  if (system("command -v jq > /dev/null") != 0) {
    WARN("SKIP: jq is not installed (scripts/setup.sh installs it); parity.sh needs it");
    return;
  }
  testing::TempDir dir;
  WriteTinyRun(dir);
  const int rc = Shell(dir.path(),
                       "CONFIG=" + dir.file("run.yaml") + " DILOCOCTL=" + kDilococtl + " NICE=0 " DILOCO_SOURCE_DIR
                       "/scripts/bench/parity.sh --modes 'ddp diloco decoupled' --set train.steps=100 --out parity",
                       "parity");
  INFO(ReadFile(dir.path() / "parity.err"));
  REQUIRE(rc == 0);
  const std::string page = ReadFile(dir.path() / "parity/report.html");
  testing::CheckEveryPanelDrawn(page);
  for (const char *mode : {"ddp", "diloco", "decoupled"}) CHECK(page.find(std::string(">") + mode + "<") != std::string::npos);
  CHECK_FALSE(fs::exists(dir.path() / "parity/runs/ddp-s1337"));  // run directories removed without --keep
  testing::RenderInChromium(dir.path() / "parity", "report.html", "parity");
}

}  // namespace diloco
