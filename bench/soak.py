"""Soak: the chaos workload and fault schedule held for a long time (30 minutes by default).

Not part of CI. Reports the load held, faults injected, messages checked, the
invariant violations (must be none) and actor memory: every actor incarnation
(a restarted actor is a new one) still alive at the end must have grown by at
most 10% since the end of its warm-up (20% of the run, from its start). Writes
``bench/results/soak.json``.

Node faults every few seconds leave few actors alive long enough for their memory
to say anything, so a second, "steady" topic runs beside the chaos topic under
the same load: namespace isolation (``RAYTOPICS_PLACEMENT``) keeps its actors on
the head node, which is never removed, and no fault targets them. It is not idle:
its lower half is split and merged in turn every ``--steady-change-s`` (controller,
coordinators, retention and the DAG watch at work), while its upper half's segment
takes writes for the whole run.

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

from runtime.names import MAX_HASH  # noqa: E402
from runtime.placement import PLACEMENT_ENV  # noqa: E402
from tests.chaos.harness import actor_memory, chaos_cluster, run_chaos, schedule  # noqa: E402
from tests.chaos.workload import finish_workload, start_workload  # noqa: E402

MAX_GROWTH = 0.10
WARM_UP = 0.2
DEFAULT_RESULTS = REPO / "bench" / "results" / "soak.json"
STEADY_RESOURCE = "soak_steady"  # only the head node has it
MIDDLE = (MAX_HASH + 1) // 2
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
    kinds: dict[str, dict[str, Any]] = {}
    for a in actors:
        kind = kinds.setdefault(a["actor"].split(":")[0], {"compared": 0, "worst_growth": 0.0})
        kind["compared"] += 1
        kind["worst_growth"] = max(kind["worst_growth"], a["growth"])
    return {
        "samples": len(samples),
        "warm_up_s": round(warm_up, 1),
        "incarnations_seen": len(born),
        "actors_compared": len(actors),
        "by_kind": kinds,
        "worst_growth": worst,
        "flat": worst <= MAX_GROWTH,
        "actors": actors,
    }


def change_steady(topic: str, stop: threading.Event, period_s: float, log: list[str]) -> None:
    """Every ``period_s``, split the steady topic's lower half or merge it back."""
    from clients import ScalableTopicsAdmin

    admin = ScalableTopicsAdmin(controller_restart_timeout_s=120)
    while not stop.wait(period_s):
        active = admin.get_layout(topic).active_segments.values()
        lower = sorted(
            (s.hash_range.start, s.segment_id) for s in active if s.hash_range.start < MIDDLE
        )
        try:
            if len(lower) == 1:
                log.append(f"split {lower[0][1]}: {admin.split_segment(topic, lower[0][1])}")
            else:
                ids = lower[0][1], lower[1][1]
                log.append(f"merge {ids}: {admin.merge_segments(topic, *ids)}")
        except Exception as err:  # reported, and the next round tries again
            log.append(f"refused: {type(err).__name__}: {err}")


def soak(
    minutes: float, seed: int, rate: float, retention_s: float, steady_change_s: float
) -> dict[str, Any]:
    """Run the chaos and steady workloads for ``minutes`` with memory sampling; report."""
    duration = minutes * 60
    plan = schedule(seed, duration)
    print(f"soak seed={seed} schedule={json.dumps(plan)}", flush=True)
    samples: Samples = []
    stop, stop_changes, changes = threading.Event(), threading.Event(), []
    os.environ[PLACEMENT_ENV] = json.dumps({"steady/*": {STEADY_RESOURCE: 0.01}})
    with chaos_cluster(nodes=3, head_resources={STEADY_RESOURCE: 100}) as cluster:
        period = max(1.0, min(10.0, duration / 30))
        sampler = threading.Thread(target=sample_memory, args=(stop, period, samples), daemon=True)
        sampler.start()
        steady_topic = f"topic://steady/soak-{os.getpid()}/events"
        steady = start_workload(cluster, steady_topic, rate, retention_s)
        args = (steady.run.topic, stop_changes, steady_change_s, changes)
        changer = threading.Thread(target=change_steady, args=args, daemon=True)
        changer.start()
        result = run_chaos(cluster, seed, plan, duration, rate, retention_s)
        stop_changes.set()
        changer.join()
        steady_result = finish_workload(steady)
        stop.set()
        sampler.join()
    return {
        "minutes": minutes,
        "seed": seed,
        "offered_msgs_per_s": rate,
        "retention_s": retention_s,
        "producing_s": result["phases_end_s"]["load"],
        "held_msgs_per_s": held(result),
        "acked": result["acked"],
        "faults_injected": len(result["faults"]),
        "faults": result["faults"],
        "messages_checked": checked(result) + checked(steady_result),
        "violations": result["violations"] + [f"steady {v}" for v in steady_result["violations"]],
        "wall_s": result["wall_s"],
        "steady": {
            "held_msgs_per_s": held(steady_result),
            "acked": steady_result["acked"],
            "changes": len(changes),
            "refused_changes": sum(c.startswith("refused") for c in changes),
            "change_log": changes,
        },
        "memory": memory_report(samples),
    }


def checked(result: dict[str, Any]) -> int:
    return result["acked"] + result["stream_delivered"] + result["queue_delivered"]


def held(result: dict[str, Any]) -> float:
    """Acked sends per second of producing."""
    return round(result["acked"] / result["phases_end_s"]["load"], 1)


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
    parser.add_argument(
        "--steady-change-s",
        type=float,
        default=60.0,
        help="how often the steady topic's lower half is split or merged back",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS)
    args = parser.parse_args()
    load_at_start = os.getloadavg()
    report = soak(args.minutes, args.seed, args.rate, args.retention_s, args.steady_change_s)
    report["machine"] = {
        "date": datetime.date.today().isoformat(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average_at_start": load_at_start,
        "load_average_at_end": os.getloadavg(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    summary = {k: v for k, v in report.items() if k not in ("faults", "memory", "steady")}
    summary["steady"] = {k: v for k, v in report["steady"].items() if k != "change_log"}
    memory = {k: v for k, v in report["memory"].items() if k != "actors"}
    print(json.dumps({**summary, "memory": memory}, indent=2), flush=True)
    return 0 if not report["violations"] and report["memory"]["flat"] else 1


if __name__ == "__main__":
    sys.exit(main())
