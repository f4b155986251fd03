// cuda_bench: the GPU numbers of scripts/gpu-check.sh.
//   cuda_bench gpt2 [B] [steps]   GPT-2 124M (L12 C768 H12 T1024, vocab 50304)
//                                 training steps: tokens/s and MFU
//   cuda_bench kernels            memory-bound kernels' GB/s against a
//                                 measured device-to-device copy
//   cuda_bench breakdown [B]      each op of a GPT-2 124M step timed alone
//                                 at its shapes, times its count per step:
//                                 which kernel holds the step back
//   cuda_bench memory L C NH T V B [recompute]
//                                 the device memory (cudaMemGetInfo) a
//                                 backend of that shape takes through one
//                                 training step, against its allocated():
//                                 what dilococtl plan is checked against
// Every result is one line "RESULT <name> <value> <unit> <target>" (the
// script turns them into its table), after human-readable lines.
// MFU counts 6 * params + 12 * L * C * T FLOPs per token (PaLM's estimate,
// as llm.c), against the device's dense bf16 peak (device.h).
// Written without a GPU at hand: it has not run yet (see gpu-check.sh).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/ops.h"
#include "kernels/rng.h"
#include "kernels/sync_sparse.h"

namespace diloco::cuda {
namespace {

void result(const char* name, double value, const char* unit, const char* target) {
  std::printf("RESULT %s %.4g %s %s\n", name, value, unit, target);
  std::fflush(stdout);
}

// Median milliseconds of fn over reps runs (after one warm-up).
double time_ms(const std::function<void()>& fn, int reps = 10) {
  EventTimer timer;
  fn();
  synchronize();
  std::vector<double> ms;
  for (int i = 0; i < reps; i++) {
    timer.start();
    fn();
    ms.push_back(timer.stop_ms());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

int bench_gpt2(int B, int steps) {
  GptConfig c;
  c.vocab_size = 50304;
  c.block_size = 1024;
  c.n_layer = 12;
  c.n_embd = 768;
  c.n_head = 12;
  const int T = c.block_size;
  std::unique_ptr<TrainingBackend> backend;
  const std::string err = CreateCudaBackend(0, BackendOptions{c, B}, &backend);
  if (!err.empty()) {
    std::fprintf(stderr, "cuda_bench: %s\n", err.c_str());
    return 1;
  }
  backend->init_weights(1);
  std::printf("gpt2-124M on %s: %zu parameters, B=%d T=%d, device memory in use %.1f GiB\n", backend->name().c_str(),
              backend->num_params(), B, T, device_memory_used_bytes() / 1073741824.0);
  Rng rng(7);
  std::vector<int> in((size_t)B * T), tg((size_t)B * T);
  for (size_t i = 0; i < in.size(); i++) {
    in[i] = (int)rng.below(c.vocab_size);
    tg[i] = (int)rng.below(c.vocab_size);
  }
  AdamWHyper hp;
  hp.lr = 6e-4f;
  hp.weight_decay = 0.1f;
  for (int i = 0; i < 3; i++) backend->train_step(in.data(), tg.data(), B, T, hp, 1.0);  // warm-up, autotuning
  EventTimer timer;
  std::vector<double> ms;
  double loss = 0;
  for (int i = 0; i < steps; i++) {
    timer.start();
    const StepStats st = backend->train_step(in.data(), tg.data(), B, T, hp, 1.0);
    ms.push_back(timer.stop_ms());
    loss = st.loss;
  }
  std::sort(ms.begin(), ms.end());
  const double step_ms = ms[ms.size() / 2];
  const double tokens_per_s = (double)B * T / (step_ms / 1e3);
  const double flops_per_token =
      6.0 * (double)backend->num_params() + 12.0 * c.n_layer * c.n_embd * (double)T;
  const double peak = peak_bf16_flops();
  const double mfu = peak > 0 ? flops_per_token * tokens_per_s / peak : 0.0;
  std::printf("median step %.2f ms, %.0f tokens/s, %.1f TFLOP/s, MFU %.1f%% (peak %.1f TFLOP/s), loss %.3f\n",
              step_ms, tokens_per_s, flops_per_token * tokens_per_s / 1e12, 100 * mfu, peak / 1e12, loss);
  std::printf("device memory in use %.1f GiB\n", device_memory_used_bytes() / 1073741824.0);
  result("gpt2_step_ms", step_ms, "ms", "-");
  result("gpt2_tokens_per_s", tokens_per_s, "tok/s", "-");
  result("gpt2_mfu", 100 * mfu, "%", ">=45");
  return 0;
}

int bench_kernels() {
  std::printf("memory-bound kernels on %s\n", device_description(0).c_str());
  // Device copy: read + write of 1 GiB.
  const size_t copy_bytes = (size_t)1 << 30;
  DeviceArray<uint8_t> src(copy_bytes), dst(copy_bytes);
  src.fill(1);
  const double copy_ms = time_ms([&] { copy_device_to_device(dst.get(), src.get(), copy_bytes); });
  const double copy_gbs = 2.0 * copy_bytes / (copy_ms / 1e3) / 1e9;
  std::printf("device copy: %.0f GB/s (read + write)\n", copy_gbs);
  result("copy_bandwidth", copy_gbs, "GB/s", "-");

  // GPT-2 124M shapes, B=16: N = 16384 rows of C = 768.
  const int B = 16, T = 1024, C = 768, V = 50304, N = B * T;
  const size_t NC = (size_t)N * C;
  Rng rng(3);
  std::vector<float> host(4 * NC);
  for (float& x : host) x = (float)(rng.normal() * 0.5);
  DeviceArray<float> f32(host);
  DeviceArray<bf16> a(4 * NC), b(4 * NC), out(4 * NC), res(NC);
  float_to_bf16(a.get(), f32.get(), 4 * NC, nullptr);
  float_to_bf16(b.get(), f32.get(), 4 * NC, nullptr);
  DeviceArray<bf16> w(C), bias(C);
  float_to_bf16(w.get(), f32.get(), C, nullptr);
  float_to_bf16(bias.get(), f32.get() + C, C, nullptr);
  DeviceArray<float> mean(N), rstd(N);

  auto report = [&](const char* name, double bytes, double ms) {
    const double gbs = bytes / (ms / 1e3) / 1e9;
    std::printf("%-28s %8.3f ms %8.0f GB/s  %5.1f%% of copy\n", name, ms, gbs, 100 * gbs / copy_gbs);
    result((std::string(name) + "_pct_of_copy").c_str(), 100 * gbs / copy_gbs, "%", ">=60");
  };
  report("layernorm_fused_fwd", 4.0 * NC * 2,
         time_ms([&] {
           layernorm_forward(res.get(), out.get(), mean.get(), rstd.get(), a.get(), b.get(), w.get(), bias.get(), N,
                             C, nullptr);
         }));
  report("gelu_fwd", 2.0 * 4 * NC * 2, time_ms([&] { gelu_forward(out.get(), a.get(), 4 * NC, nullptr); }));
  report("gelu_bwd", 3.0 * 4 * NC * 2,
         time_ms([&] { gelu_backward(out.get(), a.get(), b.get(), 4 * NC, nullptr); }));
  {
    std::vector<int> tokens(N);
    for (int& t : tokens) t = (int)rng.below(V);
    DeviceArray<int> dt(tokens);
    DeviceArray<bf16> wte((size_t)V * C), wpe((size_t)T * C);
    wte.fill(0);
    wpe.fill(0);
    report("encoder_fwd", 3.0 * NC * 2,
           time_ms([&] { encoder_forward(out.get(), dt.get(), wte.get(), wpe.get(), B, T, C, nullptr); }));
  }
  {
    // Classifier over N/4 rows of the padded GPT-2 vocabulary, in place.
    const int rows = N / 4;
    DeviceArray<bf16> logits((size_t)rows * V);
    logits.fill(0);
    std::vector<int> targets(rows);
    for (int& t : targets) t = (int)rng.below(V);
    DeviceArray<int> dt(targets);
    DeviceArray<float> losses(rows);
    report("classifier_fused", 3.0 * rows * V * 2,  // read twice, write once
           time_ms([&] {
             classifier_forward_backward(logits.get(), losses.get(), logits.get(), dt.get(), 1.0f / rows, rows, V,
                                         nullptr);
           }));
  }
  {
    // AdamW over 124M parameters: reads p, m, v, g; writes p, m, v, bf16 p.
    const size_t P = 124475904;
    DeviceArray<float> p(P), m(P), v(P), g(P);
    DeviceArray<bf16> p16(P);
    p.fill(0), m.fill(0), v.fill(0), g.fill(0);
    const AdamWArgs args{6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1};
    report("adamw", (16.0 + 14.0) * P,
           time_ms([&] { adamw_update(p.get(), p16.get(), m.get(), v.get(), g.get(), P, args, nullptr); }));
    DeviceArray<double> scratch(global_norm_scratch_doubles(P)), norm(1);
    report("global_norm", 4.0 * P, time_ms([&] { global_norm_squared(norm.get(), scratch.get(), g.get(), P, nullptr); }));

    // Codecs on the whole model with error feedback (block 64): bytes moved
    // = delta + residual read, residual written, payload written; "input"
    // rate = fp32 values encoded per second x 4 bytes.
    std::vector<float> hd(1 << 20);
    for (float& x : hd) x = (float)(rng.normal() * 1e-3);
    for (size_t off = 0; off < P; off += hd.size())
      copy_to_device(g.get() + off, hd.data(), std::min(hd.size(), P - off) * sizeof(float));
    DeviceArray<int> bad(1);
    for (int kind : {2, 3, 4}) {
      const char* name = kind == 2 ? "codec_bf16" : kind == 3 ? "codec_int8" : "codec_int4";
      const size_t bytes = sync_payload_bytes(kind, P, 64);
      DeviceArray<uint8_t> payload(bytes);
      const double enc_ms =
          time_ms([&] { sync_encode(payload.get(), m.get(), bad.get(), g.get(), kind, 64, P, nullptr); });
      const double dec_ms = time_ms([&] { sync_decode(v.get(), bad.get(), payload.get(), kind, 64, P, nullptr); });
      const double enc_in = 4.0 * P / (enc_ms / 1e3) / 1e9, dec_out = 4.0 * P / (dec_ms / 1e3) / 1e9;
      std::printf("%-28s encode+EF %7.3f ms (%6.0f GB/s of fp32 input), decode %7.3f ms (%6.0f GB/s of fp32 output)\n",
                  name, enc_ms, enc_in, dec_ms, dec_out);
      result((std::string(name) + "_encode_ef_input").c_str(), enc_in, "GB/s", ">=1000");
      result((std::string(name) + "_decode_output").c_str(), dec_out, "GB/s", ">=1000");
    }
    // The chunked top-k records (chunk 4096, keep 64, 2 bits: the defaults) of the same values,
    // without error feedback: fp32 values encoded per second x 4 bytes. No target yet.
    {
      const size_t chunk = 4096, keep = 64;
      DeviceArray<uint8_t> records(diloco::sparse_records_bytes(P, chunk, keep, 2));
      DeviceArray<uint32_t> scratch(sparse_encode_scratch_words(P, chunk, keep));
      const double ms = time_ms(
          [&] { sparse_encode(records.get(), scratch.get(), bad.get(), g.get(), P, chunk, keep, 2, nullptr); });
      const double in = 4.0 * P / (ms / 1e3) / 1e9;
      std::printf("%-28s encode    %7.3f ms (%6.0f GB/s of fp32 input)\n", "codec_topk_chunked", ms, in);
      result("codec_topk_chunked_encode_input", in, "GB/s", "-");
    }
  }
  return 0;
}


// One GPT-2 124M training step, op by op: each op timed alone on its own
// buffers at the step's shapes (median of 10), times the number of calls a
// step makes. Their sum against the measured step (cuda_bench gpt2) is the
// time spent between kernels: host work, copies, launch gaps.
int bench_breakdown(int B) {
  const int T = 1024, C = 768, NH = 12, L = 12, V = 50304, N = B * T;
  const size_t P = 124475904;
  std::printf("gpt2-124M step breakdown on %s, B=%d T=%d\n", device_description(0).c_str(), B, T);
  Rng rng(5);
  const size_t big = std::max((size_t)N * V, (size_t)N * 4 * C);
  std::vector<float> host((size_t)1 << 22);
  for (float& x : host) x = (float)(rng.normal() * 0.02);
  DeviceArray<float> seed(host);
  // bf16 buffers filled by tiling small random data (values do not matter for time).
  auto random_bf16 = [&](size_t n) {
    DeviceArray<bf16> a(n);
    for (size_t off = 0; off < n; off += host.size())
      float_to_bf16(a.get() + off, seed.get(), std::min(host.size(), n - off), nullptr);
    return a;
  };
  DeviceArray<bf16> inp = random_bf16((size_t)N * 4 * C), pre = random_bf16((size_t)N * 4 * C);
  DeviceArray<bf16> out = random_bf16(big), w = random_bf16((size_t)V * C), bias = random_bf16(V);
  DeviceArray<bf16> dinp = random_bf16((size_t)N * 4 * C);
  DeviceArray<float> dw((size_t)V * C), db(V), dwpe((size_t)T * C), mean(N), rstd(N), lse((size_t)B * NH * T),
      losses(N);
  size_t scratch_n = std::max(bias_backward_scratch_floats(N, 4 * C), layernorm_backward_scratch_floats(N, C));
  scratch_n = std::max(scratch_n, attention_backward_scratch_floats(B, T, NH));
  DeviceArray<float> scratch(scratch_n);
  dw.fill(0), db.fill(0), dwpe.fill(0);
  Gemm gemm;

  struct Row {
    std::string name;
    int count;
    double ms, flops;  // per call
  };
  std::vector<Row> rows;
  // Each row is printed as it is measured, so a failing op is the one after the last line.
  auto add = [&](const std::string& name, int count, double flops, const std::function<void()>& fn) {
    rows.push_back({name, count, time_ms(fn), flops});
    std::printf("  %-30s %9.3f ms\n", name.c_str(), rows.back().ms);
    std::fflush(stdout);
  };
  const struct {
    const char* name;
    int c, oc, count;
    bool gelu, bias;
  } linears[] = {{"qkv", C, 3 * C, L, false, true},
                 {"attproj", C, C, L, false, true},
                 {"fc+gelu", C, 4 * C, L, true, true},
                 {"fcproj", 4 * C, C, L, false, true},
                 {"lm_head", C, V, 1, false, false}};
  for (const auto& m : linears) {
    const double f = 2.0 * N * m.c * m.oc;
    add(std::string("matmul_fwd ") + m.name, m.count, f, [&] {
      gemm.matmul_forward(out.get(), m.gelu ? pre.get() : nullptr, inp.get(), w.get(), m.bias ? bias.get() : nullptr,
                          N, m.c, m.oc, nullptr);
    });
    add(std::string("matmul_bwd ") + m.name, m.count, 2 * f, [&] {
      gemm.matmul_backward(dinp.get(), dw.get(), m.bias ? db.get() : nullptr, scratch.get(), out.get(), inp.get(),
                           w.get(), N, m.c, m.oc, nullptr);
    });
  }
  const double attn_f = 2.0 * B * NH * (double)T * T * (C / NH);  // causal: half of 4 B NH T^2 hs
  add("attention_fwd", L, attn_f,
      [&] { attention_forward(out.get(), lse.get(), inp.get(), B, T, C, NH, nullptr); });
  add("attention_bwd", L, 2.5 * attn_f, [&] {
    attention_backward(dinp.get(), scratch.get(), out.get(), inp.get(), pre.get(), lse.get(), B, T, C, NH, nullptr);
  });
  add("layernorm_fwd (fused add)", 2 * L + 1, 0, [&] {
    layernorm_forward(pre.get(), out.get(), mean.get(), rstd.get(), inp.get(), dinp.get(), w.get(), bias.get(), N, C,
                      nullptr);
  });
  add("layernorm_bwd", 2 * L + 1, 0, [&] {
    layernorm_backward(dinp.get(), dw.get(), db.get(), scratch.get(), out.get(), inp.get(), w.get(), mean.get(),
                       rstd.get(), N, C, true, nullptr);
  });
  add("gelu_bwd", L, 0, [&] { gelu_backward(dinp.get(), pre.get(), out.get(), (size_t)N * 4 * C, nullptr); });
  std::vector<int> tokens(N);
  for (int& t : tokens) t = (int)rng.below(V);
  DeviceArray<int> dt(tokens);
  add("classifier (loss + dlogits)", 1, 0, [&] {
    classifier_forward_backward(out.get(), losses.get(), out.get(), dt.get(), 1.0f / N, N, V, nullptr);
  });
  {
    const TokenBuckets buckets = build_token_buckets(tokens.data(), N);
    DeviceArray<int> order(buckets.order), start(buckets.bucket_start), token(buckets.bucket_token);
    add("encoder_fwd", 1, 0, [&] { encoder_forward(out.get(), dt.get(), w.get(), w.get(), B, T, C, nullptr); });
    add("encoder_bwd", 1, 0, [&] {
      encoder_backward(dw.get(), dwpe.get(), inp.get(), order.get(), start.get(), token.get(), buckets.num_buckets(), B,
                       T, C, nullptr);
    });
    add("token buckets (host)", 1, 0, [&] { build_token_buckets(tokens.data(), N); });
  }
  {
    DeviceArray<float> p(P), m(P), v(P), g(P);
    DeviceArray<bf16> p16(P);
    p.fill(0), m.fill(0), v.fill(0), g.fill(0);
    const AdamWArgs args{6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1};
    add("zero grads", 1, 0, [&] { fill_bytes(g.get(), 0, P * sizeof(float)); });
    add("adamw", 1, 0, [&] { adamw_update(p.get(), p16.get(), m.get(), v.get(), g.get(), P, args, nullptr); });
    DeviceArray<double> norm_scratch(global_norm_scratch_doubles(P)), norm(1);
    add("global_norm", 1, 0, [&] { global_norm_squared(norm.get(), norm_scratch.get(), g.get(), P, nullptr); });
  }
  double total = 0;
  for (const Row& r : rows) total += r.ms * r.count;
  std::printf("%-30s %5s %9s %9s %6s %9s\n", "op", "calls", "ms/call", "ms/step", "share", "TFLOP/s");
  for (const Row& r : rows) {
    std::printf("%-30s %5d %9.3f %9.3f %5.1f%%", r.name.c_str(), r.count, r.ms, r.ms * r.count,
                100 * r.ms * r.count / total);
    if (r.flops > 0) std::printf(" %9.1f", r.flops / (r.ms / 1e3) / 1e12);
    std::printf("\n");
  }
  std::printf("sum of ops: %.2f ms per step (B=%d)\n", total, B);
  result("gpt2_ops_sum_ms", total, "ms", "-");
  return 0;
}

// The device memory one backend takes, measured with cudaMemGetInfo from after the context exists
// (the plan does not model the context) to after a training step (cuBLASLt's workspace and any
// lazy allocation are in by then). Parameters stay zero: the memory does not depend on them, and
// a host init of a 1B model would take longer than the step.
int bench_memory(int argc, char** argv) {
  if (argc < 8) {
    std::fprintf(stderr, "usage: cuda_bench memory L C NH T V B [recompute]\n");
    return 2;
  }
  GptConfig c;
  c.n_layer = std::atoi(argv[2]);
  c.n_embd = std::atoi(argv[3]);
  c.n_head = std::atoi(argv[4]);
  c.block_size = std::atoi(argv[5]);
  c.vocab_size = std::atoi(argv[6]);
  const int B = std::atoi(argv[7]), T = c.block_size;
  BackendOptions o{c, B};
  o.recompute = argc > 8 && std::strcmp(argv[8], "recompute") == 0;
  const size_t before = device_memory_used_bytes();
  std::unique_ptr<TrainingBackend> backend;
  if (const std::string err = CreateCudaBackend(0, o, &backend); !err.empty()) {
    std::fprintf(stderr, "cuda_bench: %s\n", err.c_str());
    return 1;
  }
  std::vector<int> in((size_t)B * T), tg((size_t)B * T);
  for (size_t i = 0; i < in.size(); i++) {
    in[i] = (int)(i * 7919 % c.vocab_size);
    tg[i] = (int)((i * 104729 + 1) % c.vocab_size);
  }
  const StepStats st = backend->train_step(in.data(), tg.data(), B, T, AdamWHyper{}, 1.0);
  synchronize();
  const size_t taken = device_memory_used_bytes() - before;
  const TrainingBackend::Allocated a = backend->allocated();
  const size_t sum = a.params + a.params_low + a.grads + a.moments + a.outer_state - a.outer_state_host + a.activations;
  const double MiB = 1048576.0;
  std::printf("%s: L%d C%d NH%d T%d V%d B%d%s, %zu parameters, step loss %.3f\n", backend->name().c_str(), c.n_layer,
              c.n_embd, c.n_head, T, c.vocab_size, B, o.recompute ? " recompute" : "", backend->num_params(),
              st.loss);
  std::printf("allocated(): params %.1f, bf16 %.1f, grads %.1f, moments %.1f, outer %.1f, activations %.1f MiB"
              " = %.1f MiB\n",
              a.params / MiB, a.params_low / MiB, a.grads / MiB, a.moments / MiB, a.outer_state / MiB,
              a.activations / MiB, sum / MiB);
  std::printf("cudaMemGetInfo: %.1f MiB taken by the backend through one step\n", taken / MiB);
  result("memory_taken_mib", taken / MiB, "MiB", "-");
  result("memory_allocated_mib", sum / MiB, "MiB", "-");
  return 0;
}

}  // namespace
}  // namespace diloco::cuda

int main(int argc, char** argv) {
  using namespace diloco::cuda;
  if (device_count() == 0) {
    std::fprintf(stderr, "cuda_bench: no CUDA device visible (check nvidia-smi)\n");
    return 2;
  }
  set_device(0);
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "gpt2") return bench_gpt2(argc > 2 ? std::atoi(argv[2]) : 32, argc > 3 ? std::atoi(argv[3]) : 10);
  if (mode == "kernels") return bench_kernels();
  if (mode == "breakdown") return bench_breakdown(argc > 2 ? std::atoi(argv[2]) : 32);
  if (mode == "memory") return bench_memory(argc, argv);
  std::fprintf(stderr,
               "usage: cuda_bench gpt2 [batch] [steps] | cuda_bench kernels | cuda_bench breakdown [batch] | "
               "cuda_bench memory L C NH T V B [recompute]\n");
  return 2;
}
