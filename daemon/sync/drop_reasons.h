// The reasons a delta is not merged, as the round book (round_book.h) writes them into events.log
// and SyncerStatus: one place for the readers that branch on them (goodput, the simulator).
#pragma once

#include <string_view>

namespace diloco {

// A delta whose steps were merged before (round_book.h): its learner counts them as merged.
inline constexpr std::string_view kAlreadyMerged = "already_merged";

// Drops whose work is not lost: it travels in the learner's next delta of the fragment
// ("replaced": the newer pending one; "late": the next one it sends), or it is in the global
// model already ("already_merged": steps a restarted learner did again).
inline bool DropKeepsWork(std::string_view why) {
  return why == "replaced" || why == "late" || why == kAlreadyMerged;
}

}  // namespace diloco
