// libFuzzer target for ParseEnvelope (built only with clang: `ninja fuzz_envelope`, not a test).
//   ./bin/fuzz_envelope -max_total_time=60 [corpus_dir]
// Input layout: byte 0 = flags (bit 0: reseal the header CRC, so inputs reach the Verifier and
// the semantic checks; bits 1-2: number of payload frames), then 2 bytes of length per payload
// frame, then frame 0, then the payload frames. An accepted message must pass the sender-side
// checks and survive build -> parse unchanged; anything else aborts.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "daemon/net/envelope.h"

using namespace diloco;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t flags = data[0];
  const size_t payload_frames = (flags >> 1) & 3;
  size_t pos = 1;
  std::vector<size_t> lengths;
  for (size_t i = 0; i < payload_frames; ++i) {
    if (pos + 2 > size) return 0;
    lengths.push_back(data[pos] | size_t{data[pos + 1]} << 8);
    pos += 2;
  }
  size_t payload_total = 0;
  for (size_t l : lengths) payload_total += l;
  if (payload_total > size - pos) return 0;
  const size_t header_len = size - pos - payload_total;
  std::vector<uint8_t> header(data + pos, data + pos + header_len);
  if (flags & 1) ResealHeader(&header);
  pos += header_len;
  std::vector<std::span<const uint8_t>> frames = {header};
  for (size_t l : lengths) {
    frames.emplace_back(data + pos, l);
    pos += l;
  }

  ParseOptions o;
  o.job_id = "job-7";
  o.model_params = 1 << 20;
  o.max_fragments = 64;
  ParsedMessage p, in_place;
  const Status st = ParseEnvelope(frames, o, &p);
  // The in-place parse runs the same checks and, made contiguous, gives the same message.
  const Status ip = ParseEnvelopeInPlace(frames, o, nullptr, &in_place);
  if (ip.ok() != st.ok() || ip.message() != st.message()) std::abort();
  if (!st.ok()) return 0;
  in_place.MakeContiguous();
  if (!(in_place.body == p.body) || in_place.payload != p.payload) std::abort();
  OutgoingMessage again;
  if (!BuildMessage(p.header, p.body, p.payload, &again).ok()) std::abort();
  std::vector<std::span<const uint8_t>> f2 = {again.header};
  for (const auto& c : again.chunks) f2.push_back(c);
  ParsedMessage q;
  if (!ParseEnvelope(f2, o, &q).ok()) std::abort();
  if (!(q.header == p.header) || !(q.body == p.body) || q.payload != p.payload) std::abort();
  return 0;
}
