#!/usr/bin/env python3
"""Time to first step of the rendered run script on the GPU machine, phase by phase, before and
after a change (issue 32): launch -> Ray -> the trainer's workers -> the vLLM rollout server
(its compile, then CUDA-graph capture and serving) -> the first validation -> step 1.

The figures are `bench/gpu_ppo.py run` records of one case run back to back on one machine
(the device has no network and its time is short, so the runs happen there and this reads
their records; CI has no GPU). The defaults are the stored pair:

  before  tests/fixtures/gpu/first_step/5090-grpo-cold.json  first launch: vLLM compiles (the
          compile cache empty, as every launch is when verl turns it off)
  after   tests/fixtures/gpu/ppo/5090-grpo.json              second launch: the compile cache
          kept by the run script (VLLM_DISABLE_COMPILE_CACHE=0) is read back
  ref     tests/fixtures/gpu/ppo/h200-gae.json               verl's default (cache off), h200

Usage: python bench/first_step.py [--before REC] [--after REC] [--ref REC|none] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import benchsafe  # noqa: E402  (bench/benchsafe.py: the bounded record reader, stdlib only)

FIX = ROOT / "tests" / "fixtures" / "gpu"
# (phase, from marker, to marker): markers are bench/gpu_ppo.py's timeline names
PHASES = (
    ("Ray up", "launch", "ray_init"),
    ("trainer workers", "ray_init", "workers_ready"),
    ("rollout server: placed and spawned", "workers_ready", "rollout_start"),
    ("rollout server: load and compile", "rollout_start", "graph_capture"),
    ("rollout server: CUDA graphs, serve", "graph_capture", "fit_ready"),
    ("first validation", "fit_ready", "validation_done"),
    ("step 1", "validation_done", "step1"),
)


def phases(rec: dict) -> dict[str, float | None]:
    t = dict(rec["timeline"], launch=0.0)
    out: dict[str, float | None] = {}
    for name, a, b in PHASES:
        out[name] = round(t[b] - t[a], 1) if t.get(a) is not None and t.get(b) is not None else None
    out["to step 1"] = t.get("step1")
    out["to ready to fit"] = t.get("fit_ready")
    return out


def record(path: Path, what: str) -> dict:
    """A gpu_ppo.py run record (benchsafe.read_json: a regular file, bounded), with the fields
    this report reads: `case`, and `timeline` mapping marker names to seconds (or null)."""
    rec = benchsafe.read_json(str(path), what)
    timeline = rec.get("timeline") if isinstance(rec, dict) else None
    if (
        not isinstance(rec, dict)
        or not isinstance(rec.get("case"), str)
        or not isinstance(timeline, dict)
        or not all(isinstance(v, (int, float)) or v is None for v in timeline.values())
    ):
        raise benchsafe.Refused(
            f"{what} {path} is not a gpu_ppo.py run record (it needs `case` and a `timeline` of "
            "seconds by marker, which a run writes once it launched). Pass a record of a launched run."
        )
    return rec


def ratio(after: float | None, before: float | None) -> float | None:
    return round(after / before, 3) if after is not None and before else None


def report(before: dict, after: dict, ref: dict | None) -> dict:
    pb, pa = phases(before), phases(after)
    rows = [{"phase": k, "before_s": pb[k], "after_s": pa[k], "ratio": ratio(pa[k], pb[k])} for k in pb]
    return {
        "before": {"case": before["case"], "exports": before.get("script_exports", {})},
        "after": {"case": after["case"], "exports": after.get("script_exports", {})},
        "rows": rows,
        "reference": {"case": ref["case"], "phases": phases(ref)} if ref else None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=Path, default=FIX / "first_step" / "5090-grpo-cold.json")
    ap.add_argument("--after", type=Path, default=FIX / "ppo" / "5090-grpo.json")
    ap.add_argument("--ref", default=str(FIX / "ppo" / "h200-gae.json"), help="a third record, or none")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    try:
        before, after = record(a.before, "--before"), record(a.after, "--after")
        ref = record(Path(a.ref), "--ref") if a.ref != "none" else None
    except benchsafe.Refused as e:
        print(f"first_step: {e} (--before/--after/--ref take records gpu_ppo.py wrote)", file=sys.stderr)
        return 2
    differ = [k for k in ("case", "profile", "card_gib", "extra_overrides") if before.get(k) != after.get(k)]
    if differ:
        print(
            f"first_step: --before and --after differ in {', '.join(differ)}: compare two runs of one case",
            file=sys.stderr,
        )
        return 2
    rep = report(before, after, ref)
    if a.json:
        print(json.dumps(rep, indent=1))
        return 0
    print(
        f"time to first step, {before['case']} on {before.get('gpu')}: {a.before.name} (before) vs {a.after.name} (after)"
    )
    print(f"{'phase':38} {'before s':>9} {'after s':>9} {'ratio':>7}")
    for r in rep["rows"]:
        cells = [f"{r[k]:>9.1f}" if r[k] is not None else f"{'-':>9}" for k in ("before_s", "after_s")]
        rat = f"{r['ratio']:>7.3f}" if r["ratio"] is not None else f"{'-':>7}"
        print(f"{r['phase']:38} {cells[0]} {cells[1]} {rat}")
    if ref:
        p = rep["reference"]["phases"]
        print(
            f"reference, verl's default (compile cache off): {ref['case']}: ready to fit {p['to ready to fit']} s, step 1 {p['to step 1']} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
