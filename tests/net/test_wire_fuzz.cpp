// Bad input: random and mutated envelopes against ParseEnvelope, ReassembleChunks and
// SnapshotAssembler. DILOCO_FUZZ_ITERATIONS (default 100000) scales it, DILOCO_FUZZ_SEED
// picks another deterministic run.
//
// Oracles, per kind of input:
//  - must reject: anything whose header bytes changed without resealing the header CRC, any
//    change to the payload frames, random bytes, and every message made invalid on purpose
//    (a field set to a value the protocol forbids, or options that exclude it). Every one of
//    these must return a non-ok Status.
//  - may accept: header bytes changed and the CRC resealed (a bit flip in `seq` is a valid,
//    different message), and a table tagged with another body type. An accepted one must be
//    a message the sender-side checks accept too, and must survive build -> parse unchanged.
// Nothing may crash (run it under -DDILOCO_SANITIZE=ON: ASan + UBSan).
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <string>

#include "daemon/net/envelope.h"
#include "daemon/util/crc32c.h"
#include "tests/net/wire_samples.h"

namespace diloco {
namespace {

using wire_test::Frames;
using wire_test::Sample;
using Rng = std::mt19937_64;
using FrameList = std::vector<std::span<const uint8_t>>;

uint64_t EnvOr(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : fallback;
}

ParseOptions FuzzOptions() {
  ParseOptions o = wire_test::SampleOptions();
  o.model_params = uint64_t{1} << 21;
  return o;
}

uint64_t Pick(Rng& rng, uint64_t n) { return n == 0 ? 0 : rng() % n; }

// Values that tend to break size and offset arithmetic.
uint64_t Interesting(Rng& rng) {
  static const uint64_t kValues[] = {0,          1,          2,          3,
                                     7,          8,          63,         64,
                                     65,         0x7f,       0x80,       0xff,
                                     0x7fff,     0x8000,     0xffff,     0x10000,
                                     0x7fffffff, 0x80000000, 0xffffffff, uint64_t{1} << 32,
                                     uint64_t{1} << 48, uint64_t{1} << 62, ~uint64_t{0} >> 1,
                                     ~uint64_t{0}, ~uint64_t{0} - 1, 4u << 20, (4u << 20) + 1};
  return kValues[Pick(rng, std::size(kValues))];
}

// ---- byte-level mutations of a buffer (never a no-op unless the buffer allows none) ----
void MutateBytes(Rng& rng, std::vector<uint8_t>* b) {
  switch (Pick(rng, b->empty() ? 1 : 8)) {
    case 0: {  // extend
      const size_t n = 1 + Pick(rng, 64);
      for (size_t i = 0; i < n; ++i) b->push_back(static_cast<uint8_t>(rng()));
      return;
    }
    case 1: {  // truncate
      b->resize(Pick(rng, b->size()));
      return;
    }
    case 2: case 3: {  // flip 1..8 bits
      const int flips = 1 + static_cast<int>(Pick(rng, 8));
      for (int i = 0; i < flips; ++i) (*b)[Pick(rng, b->size())] ^= uint8_t(1u << Pick(rng, 8));
      return;
    }
    case 4: {  // random bytes over a range
      const size_t at = Pick(rng, b->size());
      const size_t n = 1 + Pick(rng, std::min<size_t>(16, b->size() - at));
      for (size_t i = 0; i < n; ++i) (*b)[at + i] = static_cast<uint8_t>(rng());
      return;
    }
    case 5: {  // an interesting 4- or 8-byte value at an aligned position (sizes, offsets)
      const size_t width = rng() % 2 ? 8 : 4;
      if (b->size() < width) return MutateBytes(rng, b);
      const size_t at = Pick(rng, (b->size() - width) / width + 1) * width;
      const uint64_t v = Interesting(rng);
      std::memcpy(b->data() + at, &v, width);
      return;
    }
    case 6: {  // insert bytes
      const size_t at = Pick(rng, b->size() + 1);
      std::vector<uint8_t> ins(1 + Pick(rng, 16));
      for (auto& x : ins) x = static_cast<uint8_t>(rng());
      b->insert(b->begin() + static_cast<ptrdiff_t>(at), ins.begin(), ins.end());
      return;
    }
    default: {  // delete a range
      const size_t at = Pick(rng, b->size());
      const size_t n = 1 + Pick(rng, std::min<size_t>(16, b->size() - at));
      b->erase(b->begin() + static_cast<ptrdiff_t>(at), b->begin() + static_cast<ptrdiff_t>(at + n));
      return;
    }
  }
}

// ---- seeds ----
struct Seed {
  Sample sample;
  OutgoingMessage msg;  // chunks view sample.payload
  ParsedMessage parsed;
};

// ---- oracles ----
struct Tally {
  uint64_t tried = 0;
  uint64_t rejected = 0;
  uint64_t accepted = 0;
};

struct Fuzzer {
  Rng rng;
  std::deque<Seed> seeds;  // stable addresses: msg chunks point into sample.payload
  ParseOptions options = FuzzOptions();
  std::map<std::string, Tally> tally;
  std::vector<std::string> failures;
  ParsedMessage scratch;
  ParsedMessage in_place;  // ParseEnvelopeInPlace of the same input

  void Fail(const std::string& what) {
    if (failures.size() < 20) failures.push_back(what);
    else failures.back() = "... and more";
  }

  // Every input here is invalid: it must be rejected.
  void MustReject(const std::string& kind, std::span<const std::span<const uint8_t>> frames,
                  const ParseOptions& o, const std::string& detail) {
    Tally& t = tally[kind];
    ++t.tried;
    Status st = ParseEnvelope(frames, o, &scratch);
    if (st.ok()) {
      ++t.accepted;
      Fail(kind + ": accepted an invalid message (" + detail + ")");
    } else {
      ++t.rejected;
      if (st.message().empty()) Fail(kind + ": rejected with an empty message");
    }
    // The in-place parse runs the same checks.
    Status ip = ParseEnvelopeInPlace(frames, o, nullptr, &in_place);
    if (ip.ok() || ip.message() != st.message()) {
      Fail(kind + ": in place, a different verdict: \"" + ip.message() + "\" vs \"" + st.message() + "\"");
    }
  }

  // The input may be valid: when accepted, it must be self-consistent.
  void MayAccept(const std::string& kind, std::span<const std::span<const uint8_t>> frames,
                 const ParseOptions& o) {
    Tally& t = tally[kind];
    ++t.tried;
    Status st = ParseEnvelope(frames, o, &scratch);
    Status ip = ParseEnvelopeInPlace(frames, o, nullptr, &in_place);
    if (ip.ok() != st.ok() || ip.message() != st.message()) {
      Fail(kind + ": in place, a different verdict: \"" + ip.message() + "\" vs \"" + st.message() + "\"");
    }
    if (!st.ok()) {
      ++t.rejected;
      return;
    }
    ++t.accepted;
    if (ip.ok()) {
      in_place.MakeContiguous();
      if (!(in_place.header == scratch.header) || !(in_place.body == scratch.body) ||
          in_place.payload != scratch.payload || in_place.tensor_payload_offsets != scratch.tensor_payload_offsets) {
        Fail(kind + ": in place, a different parse");
      }
    }
    OutgoingMessage again;
    Status b = BuildMessage(scratch.header, scratch.body, scratch.payload, &again);
    if (!b.ok()) {
      Fail(kind + ": accepted a message the sender-side checks refuse: " + b.message());
      return;
    }
    ParsedMessage round;
    auto f = Frames(again);
    Status p = ParseEnvelope(f, o, &round);
    if (!p.ok() || !(round.header == scratch.header) || !(round.body == scratch.body) ||
        round.payload != scratch.payload) {
      Fail(kind + ": accepted message does not survive build -> parse: " + p.message());
    }
  }

  // Accepts: the unchanged seeds (sanity).
  void MustAccept(const Seed& s) {
    auto f = Frames(s.msg);
    Status st = ParseEnvelope(f, options, &scratch);
    if (!st.ok() || !(scratch.body == s.sample.body)) Fail("seed rejected: " + st.message());
  }

  // ---------------------------------------------------------------------------------------
  void HeaderBytes(const Seed& s, bool reseal) {
    std::vector<uint8_t> h = s.msg.header;
    if (reseal) {
      h.resize(h.size() - kHeaderCrcBytes);
      MutateBytes(rng, &h);
      const std::vector<uint8_t> fb_only(s.msg.header.begin(), s.msg.header.end() - kHeaderCrcBytes);
      const bool same = h == fb_only;
      // Re-add a trailer, then fix it.
      h.insert(h.end(), kHeaderCrcBytes, 0);
      ResealHeader(&h);
      FrameList f = Frames(s.msg);
      f[0] = h;
      if (same) return MayAccept("header bytes, resealed (no-op)", f, options);
      return MayAccept("header bytes, resealed", f, options);
    }
    MutateBytes(rng, &h);
    FrameList f = Frames(s.msg);
    f[0] = h;
    if (h == s.msg.header) return;  // a no-op mutation (e.g. a byte set to itself)
    MustReject("header bytes", f, options, "header mutated without resealing");
  }

  void PayloadFrames(const Seed& s) {
    FrameList f = Frames(s.msg);
    std::vector<uint8_t> storage;
    std::string what;
    const size_t chunks = f.size() - 1;
    switch (Pick(rng, chunks == 0 ? 2 : 9)) {
      case 0:  // extra frame
        storage = wire_test::RandomBytes(rng, Pick(rng, 100));
        f.insert(f.begin() + 1 + static_cast<ptrdiff_t>(Pick(rng, chunks + 1)), storage);
        what = "extra frame";
        break;
      case 1:  // no frames at all / header missing
        if (rng() % 2) {
          f.clear();
        } else {
          f.erase(f.begin());
          if (f.empty()) f.push_back(std::span<const uint8_t>());
        }
        what = "header missing";
        break;
      case 2:  // missing chunk
        f.erase(f.begin() + 1 + static_cast<ptrdiff_t>(Pick(rng, chunks)));
        what = "missing chunk";
        break;
      case 3:  // duplicated chunk
        f.insert(f.begin() + 1 + static_cast<ptrdiff_t>(Pick(rng, chunks)), f[1 + Pick(rng, chunks)]);
        what = "duplicated chunk";
        break;
      case 4: {  // a chunk one byte short / one byte long
        const size_t i = 1 + Pick(rng, chunks);
        storage.assign(f[i].begin(), f[i].end());
        if (rng() % 2 && !storage.empty()) storage.pop_back(); else storage.push_back(0);
        f[i] = storage;
        what = "chunk size";
        break;
      }
      case 5: case 6: {  // corrupted payload bytes
        const size_t i = 1 + Pick(rng, chunks);
        storage.assign(f[i].begin(), f[i].end());
        const int flips = 1 + static_cast<int>(Pick(rng, 4));
        for (int k = 0; k < flips; ++k) storage[Pick(rng, storage.size())] ^= uint8_t(1u << Pick(rng, 8));
        if (std::equal(storage.begin(), storage.end(), f[i].begin())) storage[0] ^= 1;
        f[i] = storage;
        what = "payload bit flips";
        break;
      }
      case 7: {  // re-cut: split a chunk in two
        const size_t i = 1 + Pick(rng, chunks);
        if (f[i].size() < 2) return PayloadFrames(s);
        const size_t cut = 1 + Pick(rng, f[i].size() - 1);
        auto a = f[i].subspan(0, cut), b = f[i].subspan(cut);
        f[i] = a;
        f.insert(f.begin() + static_cast<ptrdiff_t>(i) + 1, b);
        what = "split chunk";
        break;
      }
      default: {  // an empty frame or a swap of two chunks
        if (chunks >= 2) {
          std::swap(f[1], f[2]);
          what = "swapped chunks";
        } else {
          f.push_back(std::span<const uint8_t>());
          what = "empty extra frame";
        }
        break;
      }
    }
    MustReject("payload frames", f, options, what);
  }

  void RandomFrames() {
    std::vector<uint8_t> h = wire_test::RandomBytes(rng, Pick(rng, 600));
    const bool dress = rng() % 2;  // make it look like a dilocod header
    if (dress && h.size() >= 12) {
      std::memcpy(h.data() + 4, "DLCD", 4);
      ResealHeader(&h);
    }
    std::vector<std::vector<uint8_t>> extra(Pick(rng, 3));
    for (auto& e : extra) e = wire_test::RandomBytes(rng, Pick(rng, 200));
    FrameList f = {h};
    for (auto& e : extra) f.push_back(e);
    if (dress) return MayAccept("random bytes, resealed", f, options);
    // Random bytes pass the CRC trailer with probability 2^-32; this seed is fixed.
    MustReject("random bytes", f, options, "random");
  }

  void TypeConfusion(const Seed& s) {
    RawOverrides raw;
    uint8_t t = static_cast<uint8_t>(rng());
    if (rng() % 2) t = static_cast<uint8_t>(1 + Pick(rng, kNumMessageTypes));
    if (t == static_cast<uint8_t>(TypeOf(s.sample.body))) t = 0;
    raw.body_type = t;
    OutgoingMessage m;
    BuildMessageUnchecked(s.sample.header, s.sample.body, s.sample.payload, raw, &m);
    auto f = Frames(m);
    if (t == 0 || t > kNumMessageTypes) {
      return MustReject("body type invalid", f, options, "type " + std::to_string(t));
    }
    MayAccept("body type confused", f, options);
  }

  // A message made invalid on purpose, through the unchecked builder or the options.
  void Semantic(const Seed& s) {
    Sample x = s.sample;
    RawOverrides raw;
    ParseOptions o = options;
    std::string what;
    if (!BreakMessage(&x, &raw, &o, &what)) return;
    OutgoingMessage m;
    // Chunks view x.payload (same bytes as the seed's).
    BuildMessageUnchecked(x.header, x.body, x.payload, raw, &m);
    auto f = Frames(m);
    if (o.max_header_bytes == 0) o.max_header_bytes = Pick(rng, m.header.size());
    MustReject("invalid field or option", f, o, what);
  }

  bool BreakMessage(Sample* x, RawOverrides* raw, ParseOptions* o, std::string* what);

  void Reassembler();
  void Assembler();
};

template <class T>
T& Body(Sample* x) {
  return std::get<T>(x->body);
}

bool Fuzzer::BreakMessage(Sample* x, RawOverrides* raw, ParseOptions* o, std::string* what) {
  const MessageType type = TypeOf(x->body);
  PayloadInfo* p = nullptr;
  if (auto* d = std::get_if<DeltaMsg>(&x->body)) p = &d->payload;
  if (auto* g = std::get_if<GlobalMsg>(&x->body)) p = &g->payload;
  if (auto* n = std::get_if<SnapshotMsg>(&x->body)) p = &n->payload;
  const float kInf = std::numeric_limits<float>::infinity();
  const float kNaN = std::numeric_limits<float>::quiet_NaN();
  auto bad_float = [&] {
    const float v[] = {kInf, -kInf, kNaN, -1.0f, -1e-30f};
    return v[Pick(rng, 5)];
  };
  auto bad_name = [&](size_t max) {
    switch (Pick(rng, 4)) {
      case 0: return std::string("has space");
      case 1: return std::string("tab\there");
      case 2: return std::string("\x01\x7f\xff");
      default: return std::string(max + 1 + Pick(rng, 10), 'n');
    }
  };
  // Generic edits (any message), then type-specific ones.
  const int kGeneric = 10;
  const int choice = static_cast<int>(Pick(rng, kGeneric + 12));
  switch (choice) {
    case 0:
      x->header.protocol_version = rng() % 2 ? 0 : static_cast<uint32_t>(2 + Pick(rng, 1u << 31));
      *what = "protocol version";
      return true;
    case 1:
      x->header.job_id = rng() % 3 == 0 ? std::string() : rng() % 2 ? "job-8" : bad_name(kMaxJobIdBytes);
      *what = "job id " + x->header.job_id;
      return true;
    case 2:
      x->header.sender = rng() % 3 == 0 ? std::string() : bad_name(kMaxNameBytes);
      *what = "sender";
      return true;
    case 3:
      o->allowed_senders = {"learner-99", "syncer-2"};
      *what = "sender not allowed";
      return true;
    case 4:
      o->accept = kAnyMessage & ~MessageBit(type);
      *what = "type not accepted";
      return true;
    case 5:
      if (rng() % 2) o->job_id = "other-job"; else o->min_protocol_version = o->max_protocol_version = 2;
      *what = "options: job or version";
      return true;
    case 6:
      o->max_header_bytes = 0;  // Semantic() sets it below the built header's size
      *what = "header size limit";
      return true;
    default:
      break;
  }
  if (p != nullptr && rng() % 2) {
    // Top-k and topk_chunked sizes are bounded on the wire, not exact.
    const bool topk = p->topk_fraction != 0 || p->codec == CodecKind::kTopkChunked;
    const size_t ti = Pick(rng, p->tensors.size());
    TensorDescriptor& t = p->tensors[ti];
    uint64_t total = 0;
    for (const auto& d : p->tensors) total += d.encoded_bytes;
    switch (Pick(rng, 18)) {
      case 0: {
        uint64_t v = Interesting(rng);
        if (v == total) v = total + 1;
        raw->payload_bytes = v;
        *what = "payload_bytes " + std::to_string(v);
        return true;
      }
      case 1:
        raw->payload_crc32c = Crc32c(x->payload.data(), x->payload.size()) ^ (1u << Pick(rng, 32));
        *what = "payload crc";
        return true;
      case 2: {
        uint32_t v = static_cast<uint32_t>(Interesting(rng));
        const uint32_t real = static_cast<uint32_t>((total + kChunkBytes - 1) / kChunkBytes);
        if (v == real) v = real + 1;
        raw->num_chunks = v;
        *what = "num_chunks";
        return true;
      }
      case 3:
        if (total < 2) return false;
        raw->chunk_bytes = 1 + Pick(rng, total - 1);
        *what = "chunk size";
        return true;
      case 4:
        if (topk) {
          t.numel = 0;
        } else {
          // int4 packs two values a byte: only a change by 2 always changes the size.
          const uint64_t step = p->codec == CodecKind::kInt4 ? 2 : 1;
          t.numel = rng() % 2 ? t.numel + step : t.numel - step;
        }
        *what = "numel vs encoded bytes";
        return true;
      case 5:
        t.encoded_bytes += rng() % 2 ? 1 + Pick(rng, 100) : -1;
        *what = "encoded bytes";
        return true;
      case 6:
        t.numel = Interesting(rng) | (uint64_t{1} << 40);
        *what = "huge numel";
        return true;
      case 7:
        t.offset = o->model_params - t.numel + 1 + Pick(rng, ~uint64_t{0} - (o->model_params - t.numel + 1));
        *what = "offset outside the model";
        return true;
      case 8:
        if (ti == 0) return false;
        t.offset = p->tensors[ti - 1].offset + Pick(rng, p->tensors[ti - 1].numel);
        *what = "overlapping tensors";
        return true;
      case 9: {
        uint8_t c = static_cast<uint8_t>(rng());
        if (IsValidCodecKind(c)) c = 0;
        p->codec = static_cast<CodecKind>(c);
        *what = "codec";
        return true;
      }
      case 10: {
        const int v[] = {0, 1, 3, 63, 65535, 65538, 1 << 20, -2, std::numeric_limits<int>::max()};
        p->block_size = v[Pick(rng, std::size(v))];
        *what = "block size";
        return true;
      }
      case 11: {
        const double v[] = {std::nan(""), -0.1, 1.0, 1.5, std::numeric_limits<double>::infinity(), -0.0 - 1e-300};
        p->topk_fraction = v[Pick(rng, std::size(v))];
        *what = "top-k fraction";
        return true;
      }
      case 12:
        p->tensors.clear();
        *what = "no tensors";
        return true;
      case 13:
        t.name = bad_name(kMaxNameBytes);
        *what = "tensor name";
        return true;
      case 14:
        o->max_tensors = static_cast<uint32_t>(p->tensors.size() - 1);
        *what = "too many tensors";
        return true;
      case 15: {
        uint64_t end = 0;
        for (const auto& d : p->tensors) end = std::max(end, d.offset + d.numel);
        o->model_params = Pick(rng, end);
        *what = "model too small";
        return true;
      }
      case 16:
        o->max_payload_bytes = Pick(rng, total);
        *what = "payload over the limit";
        return true;
      default:
        if (!topk && p->codec != CodecKind::kFp32 && p->codec != CodecKind::kBf16) {
          // Another valid block size changes every multi-block tensor's size.
          p->block_size = p->block_size == 64 ? 256 : 64;
          bool changes = false;
          for (const auto& d : p->tensors) {
            changes |= EncodedBytes(p->codec, d.numel, p->block_size) != d.encoded_bytes;
          }
          *what = "block size vs sizes";
          return changes;
        }
        return false;
    }
  }
  const int k = static_cast<int>(Pick(rng, 6));
  switch (type) {
    case MessageType::kHello: {
      auto& m = Body<HelloMsg>(x);
      switch (k) {
        case 0: m.role = static_cast<PeerRole>(rng() % 2 ? 0 : 5 + Pick(rng, 250)); break;
        case 1: m.param_dtype = static_cast<ParamDType>(rng() % 2 ? 0 : 3 + Pick(rng, 250)); break;
        case 2: m.num_params = kMaxModelParams + 1 + Pick(rng, 1000); break;
        case 3: m.num_fragments = o->max_fragments + 1 + static_cast<uint32_t>(Pick(rng, 1000)); break;
        default: m.build.assign(kMaxTextBytes + 1, 'b'); break;
      }
      *what = "hello field " + std::to_string(k);
      return true;
    }
    case MessageType::kWelcome: {
      auto& m = Body<WelcomeMsg>(x);
      switch (k) {
        case 0: m.result = static_cast<JoinResult>(rng() % 2 ? 0 : 9 + Pick(rng, 240)); break;
        case 1: m.result = JoinResult::kNotAllowed; m.reason.clear(); break;
        case 2: m.learner = rng() % 2 ? std::string() : bad_name(kMaxNameBytes); break;
        case 3: m.param_dtype = static_cast<ParamDType>(0); break;
        case 4: m.result = JoinResult::kAccepted; m.num_fragments = static_cast<uint32_t>(m.versions.size() + 1); break;
        default: m.versions.assign(o->max_fragments + 1, 1); break;
      }
      *what = "welcome field " + std::to_string(k);
      return true;
    }
    case MessageType::kHeartbeat: {
      auto& m = Body<HeartbeatMsg>(x);
      switch (k) {
        case 0: m.state = static_cast<LearnerState>(rng() % 2 ? 0 : 7 + Pick(rng, 240)); break;
        case 1: m.loss = rng() % 2 ? kInf : -kInf; break;
        case 2: m.tokens_per_s = bad_float(); break;
        case 3: m.step_time_ms = bad_float(); break;
        case 4:
          if (m.fragments.empty()) m.fragments.push_back({});
          m.fragments.push_back(m.fragments[0]);
          break;
        default:
          m.fragments.push_back({static_cast<uint32_t>(o->max_fragments + Pick(rng, 1u << 31)), 0, 0, 0, false});
          break;
      }
      *what = "heartbeat field " + std::to_string(k);
      return true;
    }
    case MessageType::kDelta: {
      auto& m = Body<DeltaMsg>(x);
      if (k % 2) m.c_steps = 0; else m.fragment = static_cast<uint32_t>(o->max_fragments + Pick(rng, 1u << 31));
      *what = "delta c_steps or fragment";
      return true;
    }
    case MessageType::kGlobal: {
      auto& m = Body<GlobalMsg>(x);
      switch (k) {
        case 0: m.version = 0; break;
        case 1: m.base_version = m.is_full ? 1 + Pick(rng, 100) : m.version + Pick(rng, 100); break;
        case 2: m.fragment = static_cast<uint32_t>(o->max_fragments + Pick(rng, 1u << 31)); break;
        case 3:
          m.contributors.push_back({"learner-5", 0, 1, 1, bad_float()});
          break;
        case 4:
          m.contributors.push_back({rng() % 2 ? std::string() : bad_name(kMaxNameBytes), 0, 1, 1, 0.5f});
          break;
        default:
          if (m.contributors.empty()) m.contributors.push_back({"learner-5", 0, 1, 1, 0.5f});
          o->max_list = static_cast<uint32_t>(m.contributors.size() - 1);
          break;
      }
      *what = "global field " + std::to_string(k);
      return true;
    }
    case MessageType::kSnapshot: {
      auto& m = Body<SnapshotMsg>(x);
      switch (k) {
        case 0: m.fragment_crc32c ^= 1u << Pick(rng, 32); break;
        case 1: m.part = m.num_parts + static_cast<uint32_t>(Pick(rng, 100)); break;
        case 2: m.num_parts = rng() % 2 ? 0 : o->max_fragments + 1; break;
        case 3: m.fragment = static_cast<uint32_t>(m.versions.size() + Pick(rng, 100)); break;
        case 4: m.version = m.versions[m.fragment] + 1 + Pick(rng, 100); break;
        default: m.payload.codec = CodecKind::kBf16; break;
      }
      *what = "snapshot field " + std::to_string(k);
      return true;
    }
    case MessageType::kSnapshotRequest: {
      auto& m = Body<SnapshotRequestMsg>(x);
      switch (k % 3) {
        case 0: m.fragments.push_back(static_cast<uint32_t>(o->max_fragments + Pick(rng, 100))); break;
        case 1: m.fragments.push_back(7); m.fragments.push_back(7); break;
        default: m.reason.assign(kMaxTextBytes + 1, 'r'); break;
      }
      *what = "snapshot request field " + std::to_string(k % 3);
      return true;
    }
    case MessageType::kJobSpec:
      Body<JobSpecMsg>(x).config_yaml.clear();
      *what = "empty job spec";
      return true;
    case MessageType::kControl: {
      auto& m = Body<ControlMsg>(x);
      switch (k % 5) {
        case 0: m.name = rng() % 2 ? std::string() : bad_name(kMaxNameBytes); break;
        case 1: m.args.push_back({rng() % 2 ? std::string() : bad_name(kMaxNameBytes), "v"}); break;
        case 2: m.args.push_back({"k", std::string(kMaxTextBytes + 1, 'v')}); break;
        default:
          if (m.args.empty()) m.args.push_back({"k", "v"});
          o->max_list = static_cast<uint32_t>(m.args.size() - 1);
          break;
      }
      *what = "control field " + std::to_string(k % 5);
      return true;
    }
    case MessageType::kSyncerStatus: {
      auto& m = Body<SyncerStatusMsg>(x);
      switch (k % 6) {
        case 0: m.versions.assign(o->max_fragments + 1, 3); break;
        case 5: m.live_steps.assign(m.live_learners.size() + 1, 7); break;
        case 1: m.live_learners.push_back(rng() % 2 ? std::string() : bad_name(kMaxNameBytes)); break;
        case 2: m.recent_drops.push_back({"learner-1", static_cast<uint32_t>(o->max_fragments + Pick(rng, 9)), 0, ""}); break;
        case 3: m.recent_drops.push_back({"learner-1", 0, 0, std::string(kMaxTextBytes + 1, 'r')}); break;
        default: m.recent_drops.push_back({"", 0, 0, "x"}); break;
      }
      *what = "syncer status field " + std::to_string(k % 6);
      return true;
    }
  }
  return false;
}

// ReassembleChunks on random chunk lists, against an independent model of the rule.
void Fuzzer::Reassembler() {
  static const std::vector<uint8_t> pool = [] {
    Rng r(99);
    return wire_test::RandomBytes(r, kChunkBytes + 4096);
  }();
  const bool big = Pick(rng, 64) == 0;  // now and then, real 4 MiB chunks
  const size_t n = Pick(rng, 4);
  std::vector<std::span<const uint8_t>> chunks;
  uint64_t sum = 0;
  uint32_t crc = 0;
  for (size_t i = 0; i < n; ++i) {
    size_t len;
    if (big) {
      const size_t v[] = {kChunkBytes, kChunkBytes, kChunkBytes - 1, kChunkBytes + 1, 1, 4096};
      len = v[Pick(rng, std::size(v))];
    } else {
      len = Pick(rng, 300);
    }
    const size_t at = Pick(rng, pool.size() - len + 1);
    chunks.emplace_back(pool.data() + at, len);
    sum += len;
    crc = Crc32c(pool.data() + at, len, crc);
  }
  uint64_t declared = sum;
  uint32_t declared_crc = crc;
  switch (Pick(rng, 4)) {
    case 0: declared = Interesting(rng); break;
    case 1: declared_crc ^= 1u << Pick(rng, 32); break;
    default: break;
  }
  // Model: valid iff sizes are [4 MiB]* + a non-empty last, summing to declared, CRC equal.
  bool valid = declared == sum && declared_crc == crc &&
               chunks.size() == (declared + kChunkBytes - 1) / kChunkBytes;
  for (size_t i = 0; valid && i < chunks.size(); ++i) {
    valid = i + 1 < chunks.size() ? chunks[i].size() == kChunkBytes : chunks[i].size() > 0;
  }
  ParsedMessage::Bytes out;
  Status st = ReassembleChunks(chunks, declared, declared_crc, "fuzz", &out);
  Tally& t = tally["reassembler"];
  ++t.tried;
  (st.ok() ? t.accepted : t.rejected)++;
  if (st.ok() != valid) {
    Fail("reassembler: " + std::string(st.ok() ? "accepted" : "rejected") + " " +
         std::to_string(chunks.size()) + " chunks, declared " + std::to_string(declared) + ": " +
         st.message());
  } else if (st.ok()) {
    size_t pos = 0;
    for (const auto& c : chunks) {
      if (c.size() && std::memcmp(out.data() + pos, c.data(), c.size()) != 0) Fail("reassembler: bytes differ");
      pos += c.size();
    }
  }
}

// SnapshotAssembler fed a shuffled mix of parts: two snapshots of one request, one of another.
void Fuzzer::Assembler() {
  struct Part {
    ParsedMessage parsed;
    uint64_t snapshot;
    uint32_t part;
  };
  static std::vector<Part> parts;
  static std::vector<std::vector<uint8_t>> payloads;
  if (parts.empty()) {
    Rng r(7);
    payloads.reserve(16);
    for (uint64_t snap : {5, 6, 7}) {
      for (uint32_t f = 0; f < 4; ++f) {
        SnapshotMsg s;
        s.request_id = snap == 7 ? 98 : 99;
        s.snapshot_id = snap;
        s.part = f;
        s.num_parts = 4;
        s.fragment = f;
        s.versions = {snap, snap, snap, snap};
        s.version = snap;
        s.payload = wire_test::Dense(CodecKind::kFp32, 64, {{f * 100, 50}});
        payloads.push_back(wire_test::RandomBytes(r, 200));
        s.fragment_crc32c = Crc32c(payloads.back().data(), 200);
        OutgoingMessage m;
        REQUIRE(BuildMessage(wire_test::Header("syncer", f), s, payloads.back(), &m).ok());
        Part p{{}, snap, f};
        auto fr = Frames(m);
        REQUIRE(ParseEnvelope(fr, options, &p.parsed).ok());
        parts.push_back(std::move(p));
      }
    }
  }
  SnapshotAssembler a(99, 1 << 20);
  uint64_t locked = 0;  // the snapshot the first accepted part fixed
  bool have[4] = {};
  const int adds = 1 + static_cast<int>(Pick(rng, 12));
  Tally& t = tally["snapshot assembler"];
  for (int i = 0; i < adds; ++i) {
    const Part& p = parts[Pick(rng, parts.size())];
    const bool expect = p.snapshot != 7 && (locked == 0 || locked == p.snapshot) && !have[p.part];
    ParsedMessage copy = p.parsed;
    Status st = a.Add(std::move(copy));
    ++t.tried;
    (st.ok() ? t.accepted : t.rejected)++;
    if (st.ok() != expect) {
      Fail("snapshot assembler: part " + std::to_string(p.part) + " of snapshot " +
           std::to_string(p.snapshot) + (st.ok() ? " accepted" : " rejected: " + st.message()));
      return;
    }
    if (st.ok()) {
      locked = p.snapshot;
      have[p.part] = true;
    }
  }
  const bool complete = have[0] && have[1] && have[2] && have[3];
  if (a.complete() != complete) Fail("snapshot assembler: complete() disagrees");
  if (complete) {
    auto all = a.Take();
    for (uint32_t i = 0; i < all.size(); ++i) {
      if (all[i].get<SnapshotMsg>()->part != i) Fail("snapshot assembler: parts out of order");
    }
  }
}

TEST_CASE("fuzz: random and mutated envelopes are rejected, never crash", "[net][fuzz]") {
  const uint64_t iterations = EnvOr("DILOCO_FUZZ_ITERATIONS", 100000);
  Fuzzer fz;
  fz.rng.seed(EnvOr("DILOCO_FUZZ_SEED", 20261202));
  {
    Rng r(1);
    for (Sample& s : wire_test::AllSamples(r)) fz.seeds.push_back({std::move(s), {}, {}});
    // One payload over 4 MiB: two chunks.
    Sample big{wire_test::Header("learner-3", 77), {}, {}};
    DeltaMsg d;
    d.fragment = 1;
    d.c_steps = 2;
    d.c_tokens = 2;
    d.payload = wire_test::Dense(CodecKind::kFp32, 64, {{0, 1 << 20}, {1 << 20, 1000}});
    big.body = d;
    big.payload = wire_test::RandomBytes(r, (4 << 20) + 4000);
    fz.seeds.push_back({std::move(big), {}, {}});
  }
  for (Seed& s : fz.seeds) {
    REQUIRE(BuildMessage(s.sample.header, s.sample.body, s.sample.payload, &s.msg).ok());
    fz.MustAccept(s);
  }
  REQUIRE(fz.failures.empty());

  const auto t0 = std::chrono::steady_clock::now();
  const size_t small_seeds = fz.seeds.size() - 1;
  for (uint64_t i = 0; i < iterations; ++i) {
    // The 4 MiB seed costs ~1000x a small one: use it once in 512.
    const Seed& s = fz.seeds[Pick(fz.rng, 512) == 0 ? small_seeds : Pick(fz.rng, small_seeds)];
    const uint64_t kind = Pick(fz.rng, 100);
    if (kind < 22) fz.HeaderBytes(s, /*reseal=*/false);
    else if (kind < 47) fz.HeaderBytes(s, /*reseal=*/true);
    else if (kind < 70) fz.Semantic(s);
    else if (kind < 82) fz.PayloadFrames(s);
    else if (kind < 88) fz.RandomFrames();
    else if (kind < 92) fz.TypeConfusion(s);
    else if (kind < 97) fz.Reassembler();
    else fz.Assembler();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  uint64_t tried = 0, rejected = 0, accepted = 0;
  std::printf("wire fuzz: %llu iterations in %.2f s\n", static_cast<unsigned long long>(iterations), seconds);
  for (const auto& [kind, t] : fz.tally) {
    std::printf("  %-34s tried %7llu  rejected %7llu  accepted %6llu\n", kind.c_str(),
                static_cast<unsigned long long>(t.tried), static_cast<unsigned long long>(t.rejected),
                static_cast<unsigned long long>(t.accepted));
    tried += t.tried;
    rejected += t.rejected;
    accepted += t.accepted;
  }
  std::printf("  %-34s tried %7llu  rejected %7llu  accepted %6llu\n", "total",
              static_cast<unsigned long long>(tried), static_cast<unsigned long long>(rejected),
              static_cast<unsigned long long>(accepted));
  for (const auto& f : fz.failures) UNSCOPED_INFO(f);
  CHECK(fz.failures.empty());
  // Every kind of input was exercised, and the must-reject kinds were all rejected.
  if (iterations >= 10000) {
    for (const char* kind : {"header bytes", "header bytes, resealed", "invalid field or option",
                             "payload frames", "random bytes", "body type invalid",
                             "body type confused", "reassembler", "snapshot assembler"}) {
      INFO(kind);
      CHECK(fz.tally[kind].tried > 0);
    }
  }
  for (const char* kind : {"header bytes", "invalid field or option", "payload frames",
                           "random bytes", "body type invalid"}) {
    INFO(kind);
    CHECK(fz.tally[kind].accepted == 0);
  }
}

}  // namespace
}  // namespace diloco
