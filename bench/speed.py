#!/usr/bin/env python3
"""Training speed, side by side: a render's step before and after, and the micro-batch floor.

  python bench/speed.py --before A.json --after B.json [--micro MICRO.json] [--json]

A and B are `bench/gpu_ppo.py run` records of one case (the same profile, algorithm and cut; the
render before this change and today's), MICRO is `bench/actor_microbatch.py`'s record (verl's
row-loop log-probs, verl's fused kernels and the plain-torch floor on one micro-batch, timed in one
process). Prints, per step and phase, verl's own seconds (timing_s/*), tokens/s, the actor's MFU,
the time from launch to each phase both runs reached (time to first step) and nvidia-smi's peak per
phase, each with the ratio after/before; then the micro-batch table with
each variant's ratio to the floor. Exit 2 when a record is unreadable or the two runs are not of
one case (profile, algorithm, batch, response length). Standard library only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchsafe  # noqa: E402  (bench/benchsafe.py: the bounded record reader, stdlib only)

PHASES = ("gen", "old_log_prob", "ref", "values", "update_critic", "update_actor", "update_weights", "step")
CASE_KEYS = ("data.train_batch_size", "data.max_response_length", "actor_rollout_ref.rollout.n")
# the phases of a step that update or score the policy (what issue 42 holds to a fifth)
UPDATES = ("old_log_prob", "ref", "values", "update_critic", "update_actor")
BadInput = benchsafe.Refused


def read_record(path: str) -> dict:
    """A JSON record (benchsafe.read_json: a regular file, bounded) that is an object."""
    rec = benchsafe.read_json(path, "the record")
    if not isinstance(rec, dict):
        raise BadInput(f"the record {path} is not a JSON object; it is not a record. Pass the right file.")
    return rec


def case_of(rec: dict) -> dict:
    """What makes two runs one case: the profile, the algorithm and the run's sizes."""
    ov = rec.get("render_overrides") or {}
    changed = rec.get("overrides_changed") or {}
    out = {"profile": rec.get("profile")}
    for key in CASE_KEYS + ("algorithm.adv_estimator",):
        value = (changed.get(key) or {}).get("run") if key in changed else ov.get(key)
        out[key] = value
    if (
        not ov
        and out["algorithm.adv_estimator"] is None
        and any("critic/vf_loss" in m for m in steps(rec).values())
    ):
        # a record from before gpu_ppo.py kept the render's overrides (tests/fixtures/gpu/ppo/):
        # a run that trained a critic ran verl's one estimator with a critic, gae
        out["algorithm.adv_estimator"] = "gae"
    return out


def steps(rec: dict) -> dict[str, dict]:
    sm = rec.get("step_metrics")
    if not isinstance(sm, dict):
        return {}
    return {k: v for k, v in sm.items() if isinstance(v, dict)}


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def ratio(after: float | None, before: float | None) -> str:
    if after is None or before is None or before == 0:
        return "-"
    return f"{after / before:.3f}"


def compare(before: dict, after: dict) -> dict:
    """The per-step table: {step: {row: {before, after, ratio}}}."""
    cb, ca = case_of(before), case_of(after)
    if cb != ca:
        raise BadInput(f"the two records are not of one case: before {cb}, after {ca}")
    sb, sa = steps(before), steps(after)
    common = sorted(set(sb) & set(sa), key=int)
    if not common:
        raise BadInput("the two records share no finished step (step_metrics)")
    table: dict = {}
    for step in common:
        rows = {}
        for phase in PHASES:
            b, a = _num(sb[step].get(f"timing_s/{phase}")), _num(sa[step].get(f"timing_s/{phase}"))
            if b is not None or a is not None:
                rows[f"{phase} s"] = {"before": b, "after": a, "ratio": ratio(a, b)}
        for key, name in (
            ("perf/throughput", "tokens/s"),
            ("perf/mfu/actor", "actor MFU"),
            ("perf/mfu/critic", "critic MFU"),
        ):
            b, a = _num(sb[step].get(key)), _num(sa[step].get(key))
            if b is not None or a is not None:
                rows[name] = {"before": b, "after": a, "ratio": ratio(a, b)}
        tb = sum(_num(sb[step].get(f"timing_s/{p}")) or 0 for p in UPDATES)
        ta = sum(_num(sa[step].get(f"timing_s/{p}")) or 0 for p in UPDATES)
        rows["update phases s"] = {"before": tb, "after": ta, "ratio": ratio(ta, tb)}
        table[step] = rows
    peaks = {}
    pb = (before.get("smi") or {}).get("phase_peak_mib") or {}
    pa = (after.get("smi") or {}).get("phase_peak_mib") or {}
    for phase in sorted(set(pb) | set(pa)):
        peaks[phase] = {
            "before": pb.get(phase),
            "after": pa.get(phase),
            "ratio": ratio(pa.get(phase), pb.get(phase)),
        }
    tb, ta = before.get("timeline") or {}, after.get("timeline") or {}
    first = {
        mark: {
            "before": _num(tb.get(mark)),
            "after": _num(ta.get(mark)),
            "ratio": ratio(_num(ta.get(mark)), _num(tb.get(mark))),
        }
        for mark in sorted(set(tb) & set(ta), key=lambda m: _num(ta.get(m)) or 0)
    }
    gpus = {"before": before.get("gpu"), "after": after.get("gpu")}
    return {"case": ca, "gpus": gpus, "steps": table, "smi_peak_mib": peaks, "time_to_first_step_s": first}


def micro_table(micro: dict) -> dict:
    res = micro.get("results")
    if not isinstance(res, dict) or "floor" not in res:
        raise BadInput("the micro-batch record has no results with a floor")
    return {"gpu": micro.get("gpu"), "shape": micro.get("shape"), "results": res}


def fmt(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--before", required=True)
    p.add_argument("--after", required=True)
    p.add_argument("--micro")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    try:
        out = compare(read_record(a.before), read_record(a.after))
        if a.micro:
            out["micro"] = micro_table(read_record(a.micro))
    except BadInput as e:
        print(f"speed: {e}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(out, indent=1, sort_keys=True))
        return 0
    print(f"case: {json.dumps(out['case'], sort_keys=True)}")
    g = out["gpus"]
    print(f"gpu: before {g['before']}, after {g['after']}")
    if g["before"] != g["after"]:
        print("  (two kinds of card: the ratios hold the card's difference too, not only the render's)")
    for step, rows in out["steps"].items():
        print(f"\nstep {step}:               before      after   after/before")
        for name, r in rows.items():
            print(f"  {name:<20} {fmt(r['before']):>10} {fmt(r['after']):>10} {r['ratio']:>10}")
    print("\ntime from launch (s):                 before      after   after/before")
    for mark, r in out["time_to_first_step_s"].items():
        print(f"  {mark:<32} {fmt(r['before']):>10} {fmt(r['after']):>10} {r['ratio']:>10}")
    print("\nnvidia-smi peak per phase (MiB):")
    for phase, r in out["smi_peak_mib"].items():
        print(f"  {phase:<36} {fmt(r['before']):>8} {fmt(r['after']):>8} {r['ratio']:>8}")
    if "micro" in out:
        m = out["micro"]
        print(f"\none micro-batch on {m['gpu']} ({json.dumps(m['shape'], sort_keys=True)}):")
        print("  variant               fwd+bwd ms  x floor   fwd log-prob ms  x floor   TFLOP/s")
        for name, r in m["results"].items():
            print(
                f"  {name:<20} {fmt(r.get('fwd_bwd_ms')):>10} {fmt(r.get('fwd_bwd_x_floor')):>8} "
                f"{fmt(r.get('fwd_logprob_ms')):>16} {fmt(r.get('fwd_logprob_x_floor')):>8} "
                f"{fmt(r.get('fwd_bwd_tflops')):>9}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
