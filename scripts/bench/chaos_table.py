#!/usr/bin/env python3
"""Helper of scripts/bench/chaos.sh: fault schedules and the results table.

  chaos_table.py schedule --faults learners --seed 1 --horizon 120 --learners 4 \\
      [--kill-restart-s 10] [--slow-factor 3] [--slow-s 20] [--partition-s 10] [--syncer-restart-s 5]
    One JSON object: "events" (the chaos.events value for --set, YAML flow style), "lines" (the
    schedule in words), "expected_actions" (chaos lines metrics.jsonl should show if the run lasts
    long enough) and "injected_s" (seconds of fault the schedule adds, for the timeout).
  chaos_table.py table DIR [--json]
    The table of a chaos.sh output directory (every DIR/*/meta.json and its run/metrics.jsonl),
    printed and written to DIR/chaos.md; each run as one JSON object in DIR/chaos.jsonl. With
    --json the JSON objects are printed instead of the table.

Fault times come from random.Random(seed): the same seed and horizon give the same schedule.
"""
import argparse
import glob
import json
import math
import os
import random
import sys

# Faults start in [kFrom, kUntil] x the fault-free training time; the syncer is killed at kSyncerAt x.
kFrom = 0.05
kUntil = 0.60
kSyncerAt = 0.40


def fmt_t(t):
    return f"{t:.1f}"


def schedule(args):
    rng = random.Random(args.seed)
    h = args.horizon
    events, lines = [], []
    expected = 0
    injected = 0.0

    def at():
        return round(rng.uniform(kFrom * h, kUntil * h), 1)

    if args.faults == "learners":
        for learner in range(args.learners):
            t = at()
            events.append((t, f"{{at_s: {fmt_t(t)}, kill: {{learner: {learner}, "
                              f"restart_after_s: {args.kill_restart_s:g}}}}}",
                           f"t={fmt_t(t)}s kill learner-{learner}, restart at "
                           f"t={fmt_t(t + args.kill_restart_s)}s"))
            expected += 2
            injected += args.kill_restart_s
        slow = rng.randrange(args.learners)
        t = at()
        events.append((t, f"{{at_s: {fmt_t(t)}, slow: {{learner: {slow}, factor: {args.slow_factor:g}, "
                          f"duration_s: {args.slow_s:g}}}}}",
                       f"t={fmt_t(t)}s learner-{slow} {args.slow_factor:g}x slow until "
                       f"t={fmt_t(t + args.slow_s)}s"))
        expected += 2
        injected += (args.slow_factor - 1) * args.slow_s
        part = rng.randrange(args.learners)
        t = at()
        events.append((t, f"{{at_s: {fmt_t(t)}, partition: {{learner: {part}, "
                          f"duration_s: {args.partition_s:g}}}}}",
                       f"t={fmt_t(t)}s learner-{part} partitioned until t={fmt_t(t + args.partition_s)}s"))
        expected += 2
        injected += args.partition_s
    elif args.faults == "syncer":
        t = round(kSyncerAt * h, 1)
        events.append((t, f"{{at_s: {fmt_t(t)}, syncer_kill: {{restart_after_s: {args.syncer_restart_s:g}}}}}",
                       f"t={fmt_t(t)}s kill the syncer, restart at t={fmt_t(t + args.syncer_restart_s)}s"))
        expected += 2
        injected += args.syncer_restart_s
    else:
        sys.exit(f"chaos_table.py: no schedule for faults '{args.faults}' (learners or syncer)")
    events.sort(key=lambda e: e[0])
    print(json.dumps({"events": "[" + ", ".join(e[1] for e in events) + "]",
                      "lines": [e[2] for e in events],
                      "expected_actions": expected,
                      "injected_s": injected}))


def read_run(run_dir):
    """(summary or None, chaos action lines) of run_dir/run/metrics.jsonl."""
    summary, chaos = None, []
    path = os.path.join(run_dir, "run", "metrics.jsonl")
    if not os.path.exists(path):
        return None, []
    with open(path) as f:
        for line in f:
            try:
                r = json.loads(line)
            except ValueError:
                continue  # a line cut short by a kill
            if r.get("event") == "summary":
                summary = r
            elif r.get("event") == "chaos":
                chaos.append(r)
    return summary, chaos


def mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def num(x, spec):
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def load(out):
    runs = []
    for meta_path in glob.glob(os.path.join(out, "*", "meta.json")):
        with open(meta_path) as f:
            meta = json.load(f)
        d = os.path.dirname(meta_path)
        summary, chaos = read_run(d) if meta["status"] != "skipped" else (None, [])
        r = dict(meta)
        r["dir"] = d
        r["summary"] = summary if meta["status"] == "ok" else None
        r["played"] = len(chaos)
        waste = (r["summary"] or {}).get("waste") or {}
        s = r["summary"] or {}
        r["goodput"] = s.get("goodput")
        r["uptime"] = s.get("uptime")
        r["final_val_loss"] = s.get("final_val_loss")
        r["tokens"] = s.get("tokens")
        r["wall_s"] = s.get("wall_s")
        r["waste"] = {k: waste.get(k) for k in ("down", "blocked", "dropped", "discarded", "idle")}
        notes = [meta["note"]] if meta.get("note") else []
        if meta.get("expected_actions", 0) > 0 and meta["status"] != "skipped":
            if r["played"] == 0:
                notes.append("no fault was played (no chaos line in metrics.jsonl)")
            elif r["played"] < meta["expected_actions"]:
                notes.append(f"only {r['played']} of {meta['expected_actions']} fault actions played")
        if meta["status"] == "ok" and r["goodput"] is None and meta["mode"] != "ddp":
            notes.append("no goodput in the summary")
        r["notes"] = notes
        runs.append(r)
    runs.sort(key=lambda r: r["index"])
    return runs


def val_ratio(val, ref):
    return val / ref if val is not None and ref else None


def table(args):
    out = args.dir
    runs = load(out)
    if not runs:
        sys.exit(f"chaos_table.py: no runs (*/meta.json) in '{out}'")
    # The fault-free val loss of each (mode, seed) and its mean per mode.
    none_val = {(r["mode"], r["seed"]): r["final_val_loss"] for r in runs if r["faults"] == "none"}
    none_mean = {}
    for mode in {r["mode"] for r in runs}:
        none_mean[mode] = mean([v for (m, _), v in none_val.items() if m == mode])
    for r in runs:
        ref = none_val.get((r["mode"], r["seed"])) or none_mean.get(r["mode"])
        r["val_ratio"] = val_ratio(r["final_val_loss"], ref)

    records = []
    for r in runs:
        if r["status"] == "skipped":
            continue
        records.append({"mode": r["mode"], "faults": r["faults"], "seed": r["seed"],
                        "status": r["status"], "goodput": r["goodput"], "uptime": r["uptime"],
                        "final_val_loss": r["final_val_loss"], "val_ratio_to_none": r["val_ratio"],
                        "tokens": r["tokens"], "wall_s": r["wall_s"], "waste": r["waste"],
                        "chaos_played": r["played"], "chaos_expected": r.get("expected_actions", 0),
                        "note": "; ".join(r["notes"]), "run_dir": os.path.join(r["dir"], "run")})
    with open(os.path.join(out, "chaos.jsonl"), "w") as f:
        for rec in records:
            f.write(json.dumps(rec) + "\n")

    groups = {}
    for r in runs:
        groups.setdefault((r["mode"], r["faults"]), []).append(r)
    cols = ["mode", "faults", "seed", "goodput", "uptime", "w.down", "w.blocked", "w.dropped",
            "w.discarded", "val loss", "/none", "tokens", "wall s", "chaos", "note"]
    rows = []

    def row(mode, faults, seed, rs, ok, ratio, note):
        g = lambda key: mean([x[key] for x in ok])
        w = lambda key: mean([x["waste"][key] for x in ok])
        played = sum(x["played"] for x in rs)
        expected = sum(x.get("expected_actions", 0) for x in rs)
        return [mode, faults, seed, num(g("goodput"), ".3f"), num(g("uptime"), ".3f"),
                num(w("down"), ".3f"), num(w("blocked"), ".3f"), num(w("dropped"), ".3f"),
                num(w("discarded"), ".3f"), num(g("final_val_loss"), ".4f"), num(ratio, ".3f"),
                num(g("tokens"), ".0f"), num(g("wall_s"), ".1f"),
                f"{played}/{expected}" if expected else "-", note]

    for (mode, faults), rs in groups.items():
        if all(r["status"] == "skipped" for r in rs):
            rows.append([mode, faults, "-"] + ["-"] * 11 + ["skipped: " + rs[0].get("note", "")])
            continue
        rs = [r for r in rs if r["status"] != "skipped"]
        ok = [r for r in rs if r["status"] == "ok"]
        bad = [f"seed {r['seed']} {r['status']}" + (f" ({r['note']})" if len(rs) == 1 and r.get("note") else "")
               for r in rs if r["status"] != "ok"]
        notes = sorted({n for r in rs for n in r["notes"] if r["status"] == "ok"})
        gval = mean([r["final_val_loss"] for r in ok])
        seeds = " ".join(str(r["seed"]) for r in ok) or "-"
        rows.append(row(mode, faults, "mean " + seeds if len(rs) > 1 else str(rs[0]["seed"]), rs, ok,
                        val_ratio(gval, none_mean.get(mode)), "; ".join(bad + notes)))
        if len(rs) > 1:
            for r in rs:
                note = "; ".join(([r["status"]] if r["status"] != "ok" else []) + r["notes"])
                rows.append(row("", "", str(r["seed"]), [r], [r] if r["status"] == "ok" else [],
                                r["val_ratio"], note))
    widths = [max(len(c), *(len(x[i]) for x in rows)) for i, c in enumerate(cols)]
    right = set(range(2, 14))

    def line(cells):
        return "| " + " | ".join(c.rjust(widths[i]) if i in right else c.ljust(widths[i])
                                 for i, c in enumerate(cells)) + " |"

    text = [line(cols),
            "|" + "|".join(("-" * (widths[i] + 1) + ":") if i in right else "-" * (widths[i] + 2)
                           for i in range(len(cols))) + "|"]
    text += [line(x) for x in rows]
    legend = ("goodput = merged / provisioned tokens; uptime = share of the wall time the global model "
              "kept moving; w.* = waste as shares of the provisioned tokens; /none = val loss over the "
              "same mode's fault-free val loss (per seed on seed rows); chaos = fault actions played / "
              "scheduled (chaos lines in metrics.jsonl); mean rows average the seeds that finished.")
    settings_path = os.path.join(out, "settings.txt")
    settings = open(settings_path).read().strip() if os.path.exists(settings_path) else ""
    schedules = []
    for r in runs:
        p = os.path.join(r["dir"], "schedule.txt")
        if r["faults"] != "none" and os.path.exists(p):
            body = open(p).read().strip()
            schedules.append(f"- {r['mode']} {r['faults']} seed {r['seed']}:\n" +
                             "\n".join("  - " + l for l in body.splitlines()))
    md = ["# Chaos bench", ""]
    if settings:
        md += [settings, ""]
    md += text + ["", legend, ""]
    if schedules:
        md += ["## Fault schedules", ""] + schedules + [""]
    with open(os.path.join(out, "chaos.md"), "w") as f:
        f.write("\n".join(md))
    if args.json:
        for rec in records:
            print(json.dumps(rec))
    else:
        print("\n".join(text))
        print()
        print(legend)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("schedule")
    s.add_argument("--faults", required=True)
    s.add_argument("--seed", type=int, required=True)
    s.add_argument("--horizon", type=float, required=True)
    s.add_argument("--learners", type=int, default=4)
    s.add_argument("--kill-restart-s", type=float, default=10)
    s.add_argument("--slow-factor", type=float, default=3)
    s.add_argument("--slow-s", type=float, default=20)
    s.add_argument("--partition-s", type=float, default=10)
    s.add_argument("--syncer-restart-s", type=float, default=5)
    s.set_defaults(func=schedule)
    t = sub.add_parser("table")
    t.add_argument("dir")
    t.add_argument("--json", action="store_true")
    t.set_defaults(func=table)
    args = p.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
