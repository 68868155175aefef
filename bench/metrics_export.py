"""What exporting metrics every second costs, against Ray's default of every 10 s.

``backlog_age_seconds`` grows with the clock, so a scrape is only as fresh as Ray's
last export of it (``metrics_report_interval_ms``); the embedded head and the test
clusters export every 1,000 ms (``runtime.connect.LOCAL_SYSTEM_CONFIG``). Each round
starts a fresh local Ray with one interval, makes a topic of ``--segments`` (16)
segments with two subscriptions, times ``--messages`` sends through a ``Producer``,
then measures the CPU seconds every process of that Ray (the driver and all its
descendants) burns over ``--idle`` (30) seconds with nothing happening. The peer is
the same round at 10,000 ms; rounds alternate.

    .venv/bin/python bench/metrics_export.py            # 2 rounds of each, ~4 min

Prints a summary and writes bench/results/metrics_export.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from _common import machine_info, print_round, report, round_in_child, write_report  # noqa: E402

DEFAULT_RESULTS = REPO / "bench" / "results" / "metrics_export.json"
INTERVALS_MS = (10_000, 1_000)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--segments", type=int, default=16)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--idle", type=float, default=30.0)
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    parser.add_argument("--round", type=int, help=argparse.SUPPRESS)  # one round, in a child
    return parser.parse_args()


def cpu_seconds(processes: list[Any]) -> float:
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except Exception:  # a process that ended between listing and reading
            continue
        total += times.user + times.system
    return total


def one_round(interval_ms: int, args: argparse.Namespace) -> dict[str, Any]:
    """In a child process: a fresh Ray exporting every ``interval_ms``."""
    import psutil
    import ray

    from clients import Producer, ScalableTopicsAdmin
    from runtime.connect import LOCAL_SYSTEM_CONFIG

    config = {**LOCAL_SYSTEM_CONFIG, "metrics_report_interval_ms": interval_ms}
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        _system_config=config,
    )
    try:
        admin = ScalableTopicsAdmin()
        topic = "topic://bench/metrics/events"
        admin.create_scalable_topic(topic, args.segments)
        for name in ("a", "b"):
            admin.create_subscription(topic, name)
        started = time.perf_counter()
        with Producer(topic) as producer:
            for i in range(args.messages):
                producer.send(b"x" * 100, key=f"k{i % 1000}")
        send_s = time.perf_counter() - started
        time.sleep(5)  # the send's stragglers and the first maintenance rounds
        me = psutil.Process()
        processes = [me, *me.children(recursive=True)]
        before = cpu_seconds(processes)
        time.sleep(args.idle)
        idle_cpu = cpu_seconds(processes) - before
        return {
            "interval_ms": interval_ms,
            "processes": len(processes),
            "send_msgs_per_s": round(args.messages / send_s),
            "idle_cpu_s_per_s": round(idle_cpu / args.idle, 4),
        }
    finally:
        ray.shutdown()


def main() -> int:
    args = parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if args.round is not None:
        return print_round("metrics-export-bench-", lambda: one_round(args.round, args))
    info = machine_info()
    started = time.perf_counter()
    rounds: list[dict[str, Any]] = []
    for _ in range(args.rounds):
        for interval in INTERVALS_MS:
            result = round_in_child(
                __file__,
                *("--round", str(interval)),
                *("--segments", str(args.segments), "--messages", str(args.messages)),
                *("--idle", str(args.idle)),
            )
            rounds.append(result)
            print(result, flush=True)
    summary = {
        str(interval): {
            key: statistics.median(r[key] for r in rounds if r["interval_ms"] == interval)
            for key in ("send_msgs_per_s", "idle_cpu_s_per_s")
        }
        for interval in INTERVALS_MS
    }
    print(json.dumps(summary, indent=2))
    settings = {k: getattr(args, k) for k in ("rounds", "segments", "messages", "idle")}
    write_report(
        args.results,
        report("metrics_export", started, info, settings=settings, rounds=rounds, median=summary),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
