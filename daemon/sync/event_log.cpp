#include "daemon/sync/event_log.h"

#include <fstream>

namespace diloco {

nlohmann::json MergeEventToJson(const MergeEvent& event) {
  nlohmann::json contributors = nlohmann::json::array();
  for (const MergeContributor& c : event.contributors) {
    contributors.push_back({{"learner", c.learner},
                            {"weight", c.weight},
                            {"staleness", c.staleness},
                            {"base_version", c.base_version},
                            {"tokens", c.tokens},
                            {"steps", c.steps},
                            {"learner_step", c.learner_step}});
  }
  nlohmann::json skipped = nlohmann::json::array();
  for (const SkippedDelta& s : event.skipped) {
    skipped.push_back({{"learner", s.learner}, {"why", s.why}, {"detail", s.detail}, {"tokens", s.tokens}});
  }
  return {{"event", "merge"},
          {"time_ms", event.time_ms},
          {"fragment", event.fragment},
          {"version", event.version},
          {"reason", event.reason},
          {"grace_ms", event.grace_ms},
          {"delta_norm", event.delta_norm},
          {"update_norm", event.update_norm},
          {"contributors", std::move(contributors)},
          {"skipped", std::move(skipped)}};
}

bool IsMergeLine(const nlohmann::json& line) { return line.is_object() && line.value("event", "") == "merge"; }

Status MergeEventFromJson(const nlohmann::json& j, const std::string& where, MergeEvent* out) {
  MergeEvent e;
  try {
    e.time_ms = j.at("time_ms").get<int64_t>();
    e.fragment = j.at("fragment").get<int>();
    e.version = j.value("version", uint64_t{0});
    e.reason = j.value("reason", "");
    e.grace_ms = j.value("grace_ms", 0.0);
    e.delta_norm = j.value("delta_norm", 0.0);
    e.update_norm = j.value("update_norm", 0.0);
    for (const nlohmann::json& c : j.at("contributors")) {
      e.contributors.push_back({c.at("learner").get<int>(), c.value("weight", 0.0), c.value("staleness", uint64_t{0}),
                                c.value("base_version", uint64_t{0}), c.at("tokens").get<double>(),
                                c.value("steps", 0.0), c.value("learner_step", uint64_t{0})});
    }
    for (const nlohmann::json& k : j.value("skipped", nlohmann::json::array())) {
      e.skipped.push_back({k.at("learner").get<int>(), k.value("why", ""), k.value("detail", ""), k.value("tokens", 0.0)});
    }
  } catch (const nlohmann::json::exception& ex) {
    return Status::Error(where + ": a merge record without a field it needs, or of the wrong type (" + ex.what() + ")");
  }
  *out = std::move(e);
  return Status::Ok();
}

Status ReadEventLog(const std::string& path, bool missing_ok, std::vector<MergeEvent>* out) {
  std::ifstream current(path);
  if (!current) {
    if (missing_ok) return Status::Ok();
    return Status::Error("cannot open " + path + ": is it the run directory's events.log?");
  }
  struct Line {
    std::string text, where;
  };
  std::vector<Line> lines;
  for (const std::string& part : {path + ".1", path}) {
    std::ifstream in(part);
    int number = 0;
    for (std::string line; std::getline(in, line);) lines.push_back({std::move(line), part + " line " + std::to_string(++number)});
  }
  std::vector<MergeEvent> events;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].text.empty()) continue;
    const nlohmann::json j = nlohmann::json::parse(lines[i].text, nullptr, false);
    if (j.is_discarded()) {
      if (i + 1 == lines.size()) break;  // the syncer may be writing it now
      return Status::Error(lines[i].where + ": not JSON; is the file damaged?");
    }
    if (!IsMergeLine(j)) continue;
    MergeEvent e;
    DL_RETURN_IF_ERROR(MergeEventFromJson(j, lines[i].where, &e));
    events.push_back(std::move(e));
  }
  out->insert(out->end(), std::make_move_iterator(events.begin()), std::make_move_iterator(events.end()));
  return Status::Ok();
}

}  // namespace diloco
