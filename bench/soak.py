"""Soak: the chaos workload and fault schedule held for a long time (30 minutes by default).

Not part of CI. Reports the load held, faults injected, messages checked, the
invariant violations (must be none) and actor memory: every actor alive both at
warm-up (20% of the run) and at the end must have grown by at most 10%.

    python bench/soak.py --minutes 30 --seed 7
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.chaos.harness import actor_memory, chaos_cluster, run_chaos, schedule  # noqa: E402

MAX_GROWTH = 0.10


def sample_memory(stop: threading.Event, period_s: float, samples: list) -> None:
    while not stop.wait(period_s):
        samples.append((time.monotonic(), actor_memory()))


def memory_report(samples: list, started: float, warm_up_s: float) -> dict:
    """Growth of each actor incarnation from its first sample after warm-up to its last."""
    warm = next((s for t, s in samples if t - started >= warm_up_s), {})
    last = samples[-1][1] if samples else {}
    growth = {
        f"{name}#{pid}": round(last[(name, pid)] / rss - 1, 3)
        for (name, pid), rss in warm.items()
        if (name, pid) in last and rss > 0
    }
    worst = max(growth.items(), key=lambda kv: kv[1], default=("none", 0.0))
    return {"actors_compared": len(growth), "worst": worst, "flat": worst[1] <= MAX_GROWTH}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--rate", type=float, default=150.0)
    args = parser.parse_args()
    duration = args.minutes * 60
    plan = schedule(args.seed, duration)
    print(f"soak seed={args.seed} schedule={json.dumps(plan)}", flush=True)
    samples: list = []
    stop = threading.Event()
    with chaos_cluster(nodes=3) as cluster:
        started = time.monotonic()
        sampler = threading.Thread(target=sample_memory, args=(stop, 10.0, samples), daemon=True)
        sampler.start()
        result = run_chaos(cluster, args.seed, plan, duration, args.rate)
        stop.set()
        sampler.join()
    memory = memory_report(samples, started, 0.2 * duration)
    report = {
        "minutes": args.minutes,
        "held_msgs_per_s": round(result["acked"] / duration, 1),
        "faults_injected": len(result["faults"]),
        "messages_checked": result["acked"]
        + result["stream_delivered"]
        + result["queue_delivered"],
        "violations": result["violations"],
        "memory": memory,
    }
    print(json.dumps(report, indent=2), flush=True)
    return 0 if not result["violations"] and memory["flat"] else 1


if __name__ == "__main__":
    sys.exit(main())
