#include "daemon/train/learner.h"

#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <thread>

#include "daemon/net/channel.h"
#include "daemon/net/codec.h"
#include "daemon/net/wire_transport.h"
#include "daemon/sync/fold.h"
#include "daemon/sync/fragments.h"
#include "daemon/sync/merge.h"
#include "daemon/sync/syncer.h"
#include "daemon/train/data.h"
#include "daemon/util/crc32c.h"
#include "kernels/lr_schedule.h"
#include "kernels/rng.h"
#include "kernels/train_step.h"

namespace diloco {

namespace {

using Clock = std::chrono::steady_clock;

uint64_t UnixMs() {
  return (uint64_t)std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct FragState {
  std::vector<float> base;  // Θ_p as of base_version (the last global folded)
  uint64_t base_version = 0;
  uint64_t c_steps = 0, c_tokens = 0;
  bool in_flight = false;
  uint64_t sent_base = 0;
  long send_step = 0;
  std::vector<float> theta_at_send;
  bool lost = false;  // gap / CRC mismatch: no more syncing of this fragment
};

}  // namespace

Status RunLearner(net::NetContext& context, const LearnerOptions& o, LearnerResult* result) {
  const RunConfig& cfg = *o.config;
  const TrainConfig& tc = cfg.train;
  const SyncConfig& sc = cfg.sync;
  const std::string me = LearnerName(o.index);
  omp_set_num_threads(std::max(1, o.threads));
  LearnerResult res;

  std::unique_ptr<Corpus> corpus;
  DL_RETURN_IF_ERROR(Corpus::Load(cfg.data.corpus,
                                  {cfg.data.val_fraction, cfg.model.block_size, o.index, sc.learners}, &corpus));
  GptConfig gc;
  gc.block_size = cfg.model.block_size;
  gc.n_layer = cfg.model.n_layer;
  gc.n_embd = cfg.model.n_embd;
  gc.n_head = cfg.model.n_head;
  Gpt model(gc, tc.batch_size);
  std::memcpy(model.params(), o.init_params, model.num_params() * sizeof(float));
  AdamWState optimizer;

  std::vector<Fragment> frags;
  DL_RETURN_IF_ERROR(PartitionFragments(model.table(), EffectiveFragments(sc), &frags));
  const int P = (int)frags.size();
  const int H = sc.inner_steps;
  std::vector<FragState> fs(P);
  for (int p = 0; p < P; p++) fs[p].base = GatherFragment(frags[p], model.params());
  ErrorFeedback ef(CodecOptions{sc.codec.up, sc.codec.block, 0});
  const long block_after = sc.mode == SyncMode::kDiloco      ? 0
                           : sc.mode == SyncMode::kStreaming ? sc.overlap
                                                             : std::numeric_limits<long>::max();

  // Sockets (this thread's).
  auto parsed = std::make_shared<ParsedMessage>();
  ParseOptions expect;
  expect.job_id = o.job_id;
  expect.accept = MessageBit(MessageType::kGlobal) | MessageBit(MessageType::kSyncerStatus);
  expect.model_params = model.num_params();
  expect.allowed_senders = {kSyncerName};
  net::ReceiveOptions ro;
  ro.validator = net::EnvelopeValidator(expect, parsed);
  net::SocketOptions so;
  so.name = me + ".downlink";
  so.allow_plaintext = true;
  so.recv_hwm_msgs = 100000;
  so.link = o.link;
  std::unique_ptr<net::SubChannel> down;
  DL_RETURN_IF_ERROR(net::SubChannel::Create(context, so, ro, &down));
  DL_RETURN_IF_ERROR(down->Subscribe(o.job_id));
  DL_RETURN_IF_ERROR(down->Connect(o.downlink_endpoint));
  net::SocketOptions po;
  po.name = me + ".uplink";
  po.allow_plaintext = true;
  po.send_hwm_msgs = 100000;
  po.link = o.link;
  std::unique_ptr<net::PubChannel> up;
  DL_RETURN_IF_ERROR(net::PubChannel::Create(context, po, &up));
  DL_RETURN_IF_ERROR(up->Connect(o.uplink_endpoint));

  const uint64_t incarnation = std::random_device{}() | (uint64_t{std::random_device{}()} << 32);
  uint64_t seq = 0;
  auto send = [&](const MessageBody& body, std::shared_ptr<std::vector<uint8_t>> payload) -> Status {
    EnvelopeHeader h;
    h.job_id = o.job_id;
    h.sender = me;
    h.seq = ++seq;
    h.incarnation = incarnation;
    h.sent_unix_ms = UnixMs();
    OutgoingMessage om;
    std::span<const uint8_t> bytes;
    if (payload) bytes = {payload->data(), payload->size()};
    DL_RETURN_IF_ERROR(BuildMessage(h, body, bytes, &om));
    res.bytes_up += om.wire_bytes();
    net::Message m = net::ToMessage(std::move(om), payload);
    (void)up->Publish(o.job_id, m);
    return Status::Ok();
  };

  double step_ms_ema = 0;
  float last_loss = std::numeric_limits<float>::quiet_NaN();
  long step = 0;
  auto heartbeat = [&](LearnerState state) -> Status {
    HeartbeatMsg hb;
    hb.state = state;
    hb.step = step;
    hb.tokens = res.tokens;
    hb.loss = last_loss;
    hb.tokens_per_s = res.train_s > 0 ? (float)(res.tokens / res.train_s) : 0.f;
    hb.step_time_ms = (float)step_ms_ema;
    hb.interval_ms = o.heartbeat_interval_ms;
    for (int p = 0; p < P; p++)
      hb.fragments.push_back({(uint32_t)p, fs[p].base_version, fs[p].c_steps, fs[p].c_tokens, fs[p].in_flight});
    return send(hb, nullptr);
  };

  std::vector<float> local, scratch;
  auto handle_global = [&](const ParsedMessage& m) -> Status {
    const GlobalMsg* g = m.get<GlobalMsg>();
    if (!g) return Status::Ok();
    res.bytes_down += m.wire_bytes;
    if ((int)g->fragment >= P) return Status::Ok();
    FragState& f = fs[g->fragment];
    const Fragment& frag = frags[g->fragment];
    if (f.lost || g->version <= f.base_version) return Status::Ok();
    if (g->is_full || g->base_version != f.base_version) {
      f.lost = true;  // a gap: needs a snapshot (not implemented)
      res.lost_fragments++;
      return Status::Ok();
    }
    DL_RETURN_IF_ERROR(DecodeFragmentPayload(frag, g->payload, m, &scratch));
    std::vector<float> old_base;
    const bool included_self = std::any_of(g->contributors.begin(), g->contributors.end(),
                                           [&](const Contributor& c) { return c.learner == me; });
    if (sc.fold == FoldRule::kReplay && !(included_self && f.in_flight)) old_base = f.base;
    ApplyUpdate(scratch.data(), frag.numel, f.base.data());
    if (Crc32c(f.base.data(), frag.numel * sizeof(float)) != g->fragment_crc32c) {
      f.lost = true;  // needs a snapshot (not implemented)
      res.lost_fragments++;
      return Status::Ok();
    }
    local.resize(frag.numel);
    GatherFragment(frag, model.params(), local.data());
    const float* included = sc.fold != FoldRule::kReplay ? nullptr
                            : (included_self && f.in_flight) ? f.theta_at_send.data()
                                                             : old_base.data();
    FoldGlobal(sc.fold, sc.alpha, f.base.data(), included, local.data(), frag.numel);
    ScatterFragment(frag, local.data(), model.params());
    f.base_version = g->version;
    f.c_steps = 0;
    f.c_tokens = 0;
    if (f.in_flight && (included_self || g->version > f.sent_base + (uint64_t)sc.max_staleness + 1))
      f.in_flight = false;
    res.globals_applied++;
    return Status::Ok();
  };

  auto poll = [&](int timeout_ms) -> Status {
    net::Received r;
    while (down->Receive(&r, timeout_ms) == net::RecvResult::kMessage) {
      DL_RETURN_IF_ERROR(handle_global(*parsed));
      timeout_ms = 0;
    }
    return Status::Ok();
  };

  std::vector<float> delta;
  auto send_delta = [&](int p, long at_step) -> Status {
    FragState& f = fs[p];
    const Fragment& frag = frags[p];
    local.resize(frag.numel);
    GatherFragment(frag, model.params(), local.data());
    delta.resize(frag.numel);
    for (size_t i = 0; i < frag.numel; i++) delta[i] = f.base[i] - local[i];
    auto payload = std::make_shared<std::vector<uint8_t>>();
    std::vector<uint64_t> tensor_bytes;
    DL_RETURN_IF_ERROR(ef.Encode((uint32_t)p, delta, FragmentNumels(frag), payload.get(), &tensor_bytes)
                           .WithContext(me + ": encoding the delta of fragment " + std::to_string(p)));
    DeltaMsg d;
    d.fragment = (uint32_t)p;
    d.base_version = f.base_version;
    d.c_steps = f.c_steps;
    d.c_tokens = f.c_tokens;
    d.learner_step = (uint64_t)at_step;
    d.payload = FragmentPayloadInfo(frag, sc.codec.up, sc.codec.block, tensor_bytes);
    DL_RETURN_IF_ERROR(send(d, payload));
    f.in_flight = true;
    f.sent_base = f.base_version;
    f.send_step = at_step;
    f.theta_at_send = local;
    res.deltas_sent++;
    return Status::Ok();
  };

  const int B = tc.batch_size, T = cfg.model.block_size;
  const BatchSampler train(corpus->train(), B, T, mix_seed(tc.seed, (uint64_t)o.index));
  const LrSchedule schedule{(float)tc.lr, (float)tc.min_lr, tc.warmup_steps,
                            tc.lr_decay_steps > 0 ? tc.lr_decay_steps : tc.steps};
  AdamWHyper hp{.lr = (float)tc.lr,
                .beta1 = (float)tc.beta1,
                .beta2 = (float)tc.beta2,
                .eps = (float)tc.eps,
                .weight_decay = (float)tc.weight_decay};
  const double slowdown = SlowdownOf(cfg.learners, o.index);
  std::vector<int> inputs((size_t)B * T), targets((size_t)B * T);
  double recent_sum = 0;
  int recent_n = 0;
  auto last_beat = Clock::now() - std::chrono::hours(1);
  auto beat_if_due = [&]() -> Status {
    if (Clock::now() - last_beat < std::chrono::milliseconds(o.heartbeat_interval_ms)) return Status::Ok();
    last_beat = Clock::now();
    return heartbeat(LearnerState::kTraining);
  };

  for (step = 0; step < tc.steps; step++) {
    if ((o.crash && o.crash->load()) || (o.crash_after_steps >= 0 && step >= o.crash_after_steps)) {
      res.crashed = true;
      break;
    }
    DL_RETURN_IF_ERROR(poll(0));
    // Lock-step modes: wait for fragments in flight too long.
    for (int p = 0; p < P; p++) {
      const auto w0 = Clock::now();
      while (fs[p].in_flight && !fs[p].lost && step - fs[p].send_step >= block_after) {
        if (o.crash && o.crash->load()) break;
        DL_RETURN_IF_ERROR(beat_if_due());
        DL_RETURN_IF_ERROR(poll(10));
        if (Clock::now() - w0 > std::chrono::seconds(120))
          return Status::Error(me + ": waited 120 s for the global of fragment " + std::to_string(p) +
                               " at step " + std::to_string(step) + "; is the syncer running?");
      }
      res.wait_s += std::chrono::duration<double>(Clock::now() - w0).count();
    }
    DL_RETURN_IF_ERROR(beat_if_due());
    train.Sample(step, inputs.data(), targets.data());
    hp.lr = lr_at(schedule, (int)step);
    const auto t0 = Clock::now();
    const StepStats st = train_step(model, optimizer, inputs.data(), targets.data(), B, T, hp, tc.grad_clip);
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (!st.applied)
      return Status::Error(me + ": training diverged at step " + std::to_string(step) +
                           " (loss or gradient NaN/Inf). Try a lower train.lr or sync.outer.lr");
    if (slowdown > 1) std::this_thread::sleep_for(std::chrono::duration<double>((slowdown - 1) * dt));
    const double step_s = std::chrono::duration<double>(Clock::now() - t0).count();
    step_ms_ema = step_ms_ema == 0 ? step_s * 1e3 : step_ms_ema + 0.2 * (step_s * 1e3 - step_ms_ema);
    res.train_s += step_s;
    res.tokens += (long)B * T;
    last_loss = (float)st.loss;
    recent_sum += st.loss;
    recent_n++;
    for (auto& f : fs) {
      f.c_steps++;
      f.c_tokens += (uint64_t)B * T;
    }
    const long done = step + 1;
    for (int p = 0; p < P; p++)
      if (Fires(p, done, H, P) && !fs[p].in_flight && !fs[p].lost) DL_RETURN_IF_ERROR(send_delta(p, done));
    if (done % tc.log_every == 0 || done == tc.steps) {
      res.final_train_loss = recent_sum / recent_n;
      recent_sum = 0;
      recent_n = 0;
      if (o.metrics) {
        std::lock_guard<std::mutex> lock(*o.metrics_mu);
        (void)o.metrics->Write({{"learner", o.index},
                                {"step", done},
                                {"loss", st.loss},
                                {"lr", hp.lr},
                                {"grad_norm", st.grad_norm},
                                {"tokens", res.tokens},
                                {"step_ms", step_s * 1e3},
                                {"tok_per_s", res.tokens / res.train_s},
                                {"bytes_up", res.bytes_up},
                                {"bytes_down", res.bytes_down},
                                {"versions", [&] {
                                   std::vector<uint64_t> v;
                                   for (auto& f : fs) v.push_back(f.base_version);
                                   return v;
                                 }()}});
      }
    }
  }
  res.steps = step;
  if (!res.crashed) {
    // The work since each fragment's last send goes to the syncer too.
    DL_RETURN_IF_ERROR(poll(0));
    for (int p = 0; p < P; p++)
      if (!fs[p].in_flight && !fs[p].lost && fs[p].c_steps > 0) DL_RETURN_IF_ERROR(send_delta(p, step));
    DL_RETURN_IF_ERROR(heartbeat(LearnerState::kFinished));
    DL_RETURN_IF_ERROR(poll(0));
  }
  *result = res;
  return Status::Ok();
}

}  // namespace diloco
