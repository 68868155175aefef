"""Soak: the chaos workload and fault schedule held for a long time (30 minutes by default).

Not part of CI. Reports the load held, faults injected, messages checked, the
invariant violations (must be none) and actor memory: every actor incarnation
alive both at the end of warm-up (20% of the run) and at the end must have
grown by at most 10% (a restarted actor is a new incarnation, compared from its
first sample after warm-up). Writes ``bench/results/soak.json``.

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


def memory_report(samples: Samples, warm_at: float) -> dict[str, Any]:
    """Growth of each actor incarnation from its first sample after warm-up to its last."""
    first: dict[tuple[str, int], int] = {}
    last: dict[tuple[str, int], int] = {}
    for at, sizes in samples:
        if at < warm_at:
            continue
        for incarnation, rss in sizes.items():
            first.setdefault(incarnation, rss)
            last[incarnation] = rss
    actors = [
        {
            "actor": name,
            "pid": pid,
            "rss_mb_after_warm_up": round(rss / 2**20, 1),
            "rss_mb_at_end": round(last[(name, pid)] / 2**20, 1),
            "growth": round(last[(name, pid)] / rss - 1, 3),
        }
        for (name, pid), rss in sorted(first.items())
        if rss > 0
    ]
    worst = max((a["growth"] for a in actors), default=0.0)
    return {
        "samples": len(samples),
        "actors_compared": len(actors),
        "worst_growth": worst,
        "flat": worst <= MAX_GROWTH,
        "actors": actors,
    }


def soak(minutes: float, seed: int, rate: float) -> dict[str, Any]:
    """Run the chaos workload for ``minutes`` with memory sampling; return the report."""
    duration = minutes * 60
    plan = schedule(seed, duration)
    print(f"soak seed={seed} schedule={json.dumps(plan)}", flush=True)
    samples: Samples = []
    stop = threading.Event()
    with chaos_cluster(nodes=3) as cluster:
        started = time.monotonic()
        period = max(1.0, min(10.0, duration / 30))
        sampler = threading.Thread(target=sample_memory, args=(stop, period, samples), daemon=True)
        sampler.start()
        result = run_chaos(cluster, seed, plan, duration, rate)
        stop.set()
        sampler.join()
    return {
        "minutes": minutes,
        "seed": seed,
        "offered_msgs_per_s": rate,
        "held_msgs_per_s": round(result["acked"] / duration, 1),
        "acked": result["acked"],
        "faults_injected": len(result["faults"]),
        "faults": result["faults"],
        "messages_checked": result["acked"]
        + result["stream_delivered"]
        + result["queue_delivered"],
        "violations": result["violations"],
        "wall_s": result["wall_s"],
        "memory": memory_report(samples, started + WARM_UP * duration),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--rate", type=float, default=150.0, help="offered messages per second")
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS)
    args = parser.parse_args()
    load_at_start = os.getloadavg()
    report = soak(args.minutes, args.seed, args.rate)
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
