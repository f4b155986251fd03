#include "daemon/train/inner_loop.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "daemon/train/ring_control.h"
#include "daemon/train/trainer.h"
#include "kernels/lr_schedule.h"

namespace diloco {

namespace {

using Clock = std::chrono::steady_clock;

Status FromComm(const CommStatus& st, long step) {
  if (st.ok()) return Status::Ok();
  return Status::Error("local ring failed at step " + std::to_string(step) + ": " + st.error);
}

// Sorts ranges and joins overlapping or touching ones: a fragment folded twice while rank 0 waited
// is broadcast once.
void MergeRanges(std::vector<ParamRange>* ranges) {
  std::sort(ranges->begin(), ranges->end(),
            [](const ParamRange& a, const ParamRange& b) { return a.offset < b.offset; });
  std::vector<ParamRange> merged;
  for (const ParamRange& r : *ranges) {
    if (!merged.empty() && r.offset <= merged.back().offset + merged.back().count) {
      merged.back().count = std::max(merged.back().count, r.offset + r.count - merged.back().offset);
    } else {
      merged.push_back(r);
    }
  }
  *ranges = std::move(merged);
}

// Every rank: learn rank 0's control for `step` and copy the parameters it changed. A follower
// first serves the commands rank 0 sends before it (commands; none expected when null).
// On rank 0, *control is the input; elsewhere the output (stop and the step to take).
CommStatus ShareControl(LocalComm& comm, TrainingBackend& backend, RingCommandHandler* commands,
                        StepControl* control, long* step) {
  if (comm.world_size() == 1) return CommStatus::Ok();
  const bool leader = comm.rank() == 0;
  if (leader) MergeRanges(&control->changed);
  RingHeader h;
  if (leader) {
    h.slot[kRingStop] = control->stop;
    h.slot[kRingRanges] = (double)control->changed.size();
    h.slot[kRingStep] = (double)*step;
    h.slot[kRingLrStep] = (double)control->lr_step;
  }
  CommStatus st = CommStatus::Ok();
  for (;;) {
    st = ExchangeRingHeader(comm, &h);
    if (!st.ok()) return st;
    if (leader || h.slot[kRingCommand] == 0) break;
    if (commands == nullptr || h.slot[kRingCommand] == kRingRelease)
      return CommStatus::Error("rank " + std::to_string(comm.rank()) + " got command " +
                               std::to_string((int)h.slot[kRingCommand]) + " from rank 0 and serves none; this is a bug");
    if (Status served = commands->Serve(h); !served.ok()) return CommStatus::Error(served.message());
  }
  control->stop = h.slot[kRingStop] != 0;
  *step = (long)h.slot[kRingStep];
  control->lr_step = (long)h.slot[kRingLrStep];
  if (control->stop) return CommStatus::Ok();
  const size_t n = (size_t)h.slot[kRingRanges];
  std::vector<double> ranges(2 * n, 0.0);
  if (leader)
    for (size_t i = 0; i < n; i++) {
      ranges[2 * i] = (double)control->changed[i].offset;
      ranges[2 * i + 1] = (double)control->changed[i].count;
    }
  if (n > 0) {
    st = comm.all_reduce_host(ranges.data(), (int)ranges.size(), ReduceOp::kSum);
    if (!st.ok()) return st;
  }
  for (size_t i = 0; i < ranges.size(); i += 2) {
    const size_t offset = (size_t)ranges[i], count = (size_t)ranges[i + 1];
    st = comm.broadcast(backend.param_buffer() + offset, count, 0);
    if (!st.ok()) return st;
    backend.params_written(offset, count);  // rank 0 too: a hook may have written param_buffer()
  }
  return CommStatus::Ok();
}

}  // namespace

InnerLoopOptions RankLoopOptions(const RunConfig& config, const BatchSampler& sampler, int rank, long start_step) {
  InnerLoopOptions lo;
  lo.start_step = start_step;
  lo.end_step = config.train.steps;
  lo.train = &config.train;
  lo.sampler = &sampler;
  lo.rows = config.train.batch_size;
  lo.row_begin = rank * lo.rows;
  lo.block_size = config.model.block_size;
  return lo;
}

CommStatus StopFollowers(LocalComm& comm) {
  RingHeader h;
  h.slot[kRingStop] = 1;
  return ExchangeRingHeader(comm, &h);
}

Status RunInnerLoop(const InnerLoopOptions& o, TrainingBackend& backend, LocalComm& comm, InnerLoopHook* hook,
                    long* steps_done) {
  const bool leader = comm.rank() == 0;
  const TrainConfig& tc = *o.train;
  const LrSchedule schedule = LrScheduleOf(tc);
  AdamWHyper hp = AdamWHyperOf(tc);
  const int B = o.rows, T = o.block_size;
  std::vector<int> inputs((size_t)B * T), targets((size_t)B * T);
  long step = o.start_step;
  *steps_done = step;
  for (;;) {
    StepControl control;
    Status hook_error;
    if (leader) {
      if (step >= o.end_step) {
        control.stop = true;
      } else if (hook) {
        hook_error = hook->BeforeStep(step, backend, &control);
        if (!hook_error.ok()) {
          control = StepControl();
          control.stop = true;
        }
      }
    }
    DL_RETURN_IF_ERROR(FromComm(ShareControl(comm, backend, o.commands, &control, &step), step));
    DL_RETURN_IF_ERROR(hook_error);
    if (control.stop) break;

    o.sampler->SampleRows(step, o.row_begin, B, inputs.data(), targets.data());
    hp.lr = lr_at(schedule, (int)(control.lr_step >= 0 ? control.lr_step : step));
    const auto t0 = Clock::now();
    StepResult r;
    r.step = step;
    r.lr = hp.lr;
    DL_RETURN_IF_ERROR(
        FromComm(ring_train_step(backend, comm, inputs.data(), targets.data(), B, T, hp, tc.grad_clip, &r.stats),
                 step));
    r.step_s = std::chrono::duration<double>(Clock::now() - t0).count();
    Status after = hook ? hook->AfterStep(r, backend) : Status::Ok();
    if (!r.stats.applied && after.ok())
      after = Status::Error("training diverged at step " + std::to_string(step) +
                            " (loss or gradient NaN/Inf); the step was not applied. Try a lower train.lr");
    if (!after.ok()) {
      // Every rank saw the same non-finite mean; a hook error on rank 0 must release the others.
      if (leader && r.stats.applied) (void)StopFollowers(comm);
      *steps_done = step;
      return after;
    }
    step++;
    *steps_done = step;
  }
  return Status::Ok();
}

}  // namespace diloco
