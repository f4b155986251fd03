// What learner and syncer agree on, beyond the wire format (net/envelope.h): names, the
// payload of a fragment, and the uplink's two streams. The learner includes this, not syncer.h.
//
// Uplink streams (one PUB socket each, so each is its own TCP connection and its own flow on an
// emulated link): the main stream (topic = job id) carries the training thread's deltas and
// heartbeats, in order, numbered by one sequence; the liveness stream (topic LivenessTopic) carries
// only heartbeats, from a thread of their own, so a long step or a long delta transfer does not
// make a healthy learner look dead. The syncer tracks sequences per topic and acks the main
// stream's highest seq in SyncerStatus (LearnerAck).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "daemon/config/sync_config.h"
#include "daemon/net/codec.h"
#include "daemon/net/envelope.h"
#include "daemon/sync/fragments.h"
#include "daemon/util/status.h"

namespace diloco {

inline std::string LearnerName(int index) { return "learner-" + std::to_string(index); }
// -1 unless name is "learner-<index>".
int LearnerIndexOf(const std::string& name);
inline constexpr const char* kSyncerName = "syncer";

inline std::string LivenessTopic(const std::string& job_id) { return job_id + ".alive"; }

// Element counts of the fragment's ranges, in order (one payload tensor per range: a whole
// tensor or a row piece of one, named by RangeName).
std::vector<uint64_t> FragmentNumels(const Fragment& fragment);
// The PayloadInfo describing a fragment encoded with EncodeTensors (tensor_bytes from it).
PayloadInfo FragmentPayloadInfo(const Fragment& fragment, const CodecOptions& codec,
                                const std::vector<uint64_t>& tensor_bytes);
// The run config's codecs of the uplink (deltas) and the downlink (updates): sync.codec.*.
CodecOptions UplinkCodec(const SyncConfig& sync);
CodecOptions DownlinkCodec(const SyncConfig& sync);
// Error feedback of both links' senders (sync.codec.feedback / decay).
FeedbackOptions LinkFeedback(const SyncConfig& sync);
// Checks that a payload describes exactly the fragment's ranges; *tensor_bytes: their encoded sizes.
Status CheckFragmentPayload(const Fragment& fragment, const PayloadInfo& info, std::vector<uint64_t>* tensor_bytes);
// Decodes a payload that must describe exactly the fragment's ranges into out (fragment.numel).
Status DecodeFragmentPayload(const Fragment& fragment, const PayloadInfo& info,
                             const ParsedMessage& message, std::vector<float>* out);

}  // namespace diloco
