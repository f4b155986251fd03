// The reasons a delta is not merged, as the round book (round_book.h) writes them into events.log
// and SyncerStatus: one place for the readers that branch on them (goodput, the simulator).
#pragma once

#include <string_view>

namespace diloco {

// Drops whose work is not lost: it travels in the learner's next delta of the fragment
// ("replaced": the newer pending one; "late": the next one it sends).
inline bool DropKeepsWork(std::string_view why) { return why == "replaced" || why == "late"; }

}  // namespace diloco
