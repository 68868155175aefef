"""Soak: the chaos workload and fault schedule held for a long time (30 minutes by default).

Not part of CI. Reports the load held, faults injected, messages checked, the
invariant violations (must be none) and actor memory: every actor incarnation
(a restarted actor is a new one) still alive at the end must have grown by at
most 10% since the end of its warm-up (20% of the run, from its start). Writes
``bench/results/soak.json``.

    python bench/soak.py --minutes 30 --seed 7
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.chaos.harness import actor_memory, chaos_cluster, run_chaos, schedule  # noqa: E402

MAX_GROWTH = 0.10
WARM_UP = 0.2
DEFAULT_RESULTS = REPO / "bench" / "results" / "soak.json"
Samples = list[tuple[float, dict[tuple[str, int], int]]]


def sample_memory(stop: threading.Event, period_s: float, samples: Samples) -> None:
    """RSS of every actor every ``period_s``; the first sample is taken at once."""
    while True:
        samples.append((time.monotonic(), actor_memory()))
        if stop.wait(period_s):
            return


def memory_report(samples: Samples) -> dict[str, Any]:
    """Growth of each actor incarnation from the end of its own warm-up to its last sample.

    Warm-up is ``WARM_UP`` of the run's actual length (faults stretch a run well
    past its nominal minutes), counted from when the incarnation first showed up:
    a segment born late boots its libraries after the run's own warm-up, which
    is growth but not a leak. An incarnation that died or never warmed up is
    not compared; the report says how many were.
    """
    if not samples:
        return {"samples": 0, "actors_compared": 0, "worst_growth": 0.0, "flat": True}
    warm_up = WARM_UP * (samples[-1][0] - samples[0][0])
    born: dict[tuple[str, int], float] = {}
    warm: dict[tuple[str, int], int] = {}
    for at, sizes in samples:
        for incarnation, rss in sizes.items():
            born.setdefault(incarnation, at)
            if at - born[incarnation] >= warm_up:
                warm.setdefault(incarnation, rss)
    last = samples[-1][1]
    actors = [
        {
            "actor": name,
            "pid": pid,
            "rss_mb_after_warm_up": round(rss / 2**20, 1),
            "rss_mb_at_end": round(last[(name, pid)] / 2**20, 1),
            "growth": round(last[(name, pid)] / rss - 1, 3),
        }
        for (name, pid), rss in sorted(warm.items())
        if (name, pid) in last
    ]
    worst = max((a["growth"] for a in actors), default=0.0)
    return {
        "samples": len(samples),
        "warm_up_s": round(warm_up, 1),
        "incarnations_seen": len(born),
        "actors_compared": len(actors),
        "worst_growth": worst,
        "flat": worst <= MAX_GROWTH,
        "actors": actors,
    }


def soak(minutes: float, seed: int, rate: float, retention_s: float) -> dict[str, Any]:
    """Run the chaos workload for ``minutes`` with memory sampling; return the report."""
    duration = minutes * 60
    plan = schedule(seed, duration)
    print(f"soak seed={seed} schedule={json.dumps(plan)}", flush=True)
    samples: Samples = []
    stop = threading.Event()
    with chaos_cluster(nodes=3) as cluster:
        period = max(1.0, min(10.0, duration / 30))
        sampler = threading.Thread(target=sample_memory, args=(stop, period, samples), daemon=True)
        sampler.start()
        result = run_chaos(cluster, seed, plan, duration, rate, retention_s)
        stop.set()
        sampler.join()
    return {
        "minutes": minutes,
        "seed": seed,
        "offered_msgs_per_s": rate,
        "retention_s": retention_s,
        "producing_s": result["phases_end_s"]["load"],
        "held_msgs_per_s": round(result["acked"] / result["phases_end_s"]["load"], 1),
        "acked": result["acked"],
        "faults_injected": len(result["faults"]),
        "faults": result["faults"],
        "messages_checked": result["acked"]
        + result["stream_delivered"]
        + result["queue_delivered"],
        "violations": result["violations"],
        "wall_s": result["wall_s"],
        "memory": memory_report(samples),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--rate", type=float, default=150.0, help="offered messages per second")
    parser.add_argument(
        "--retention-s",
        type=float,
        default=60.0,
        help="the topic's retention time: drained sealed segments are pruned after it",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS)
    args = parser.parse_args()
    load_at_start = os.getloadavg()
    report = soak(args.minutes, args.seed, args.rate, args.retention_s)
    report["machine"] = {
        "date": datetime.date.today().isoformat(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average_at_start": load_at_start,
        "load_average_at_end": os.getloadavg(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    summary = {k: v for k, v in report.items() if k not in ("faults", "memory")}
    memory = {k: v for k, v in report["memory"].items() if k != "actors"}
    print(json.dumps({**summary, "memory": memory}, indent=2), flush=True)
    return 0 if not report["violations"] and report["memory"]["flat"] else 1


if __name__ == "__main__":
    sys.exit(main())
