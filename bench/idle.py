"""What an idle topic costs: the CPU of every process while nothing is sent or read.

Issue 47's goal is a topic of 32 idle segments at under 5% of one core, Ray's own
processes included. Each round starts a fresh local Ray (the embedded settings,
``runtime.connect.LOCAL_SYSTEM_CONFIG``) in a child process and measures, over
``--idle`` (60) seconds, the CPU seconds of every process of that Ray, grouped by
what it is. Two variants alternate:

- ``topic``: a topic of ``--segments`` (32) segments with two subscriptions, written to
  (``--messages`` sends) and read by a stream consumer that then closes, so every
  segment has flushed, served reads and been maintained before it goes quiet;
- ``peer``: as many trivial async Ray actors, each a process that does nothing: the
  floor any design with one process per segment pays on this Ray.

    .venv/bin/python bench/idle.py            # 2 rounds of each, ~6 min

Prints a summary and writes bench/results/idle.json.
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

DEFAULT_RESULTS = REPO / "bench" / "results" / "idle.json"
VARIANTS = ("peer", "topic")
# Process groups, by the title Ray gives a worker (``ray::ClassName``) or the program.
GROUPS = {
    "ray::SegmentActor": "segments",
    "ray::Idle": "segments",  # the peer's stand-ins
    "ray::ScalableTopicControllerActor": "controller",
    "ray::SubscriptionCoordinator": "coordinators",
    "ray::DagWatchServer": "dag watch",
    "ray::AdminService": "admin service",
    "gcs_server": "gcs",
    "raylet": "raylet",
    "dashboard": "ray agents",
    "runtime_env": "ray agents",
    "log_monitor": "ray agents",
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--segments", type=int, default=32)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--idle", type=float, default=60.0)
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)  # in a child
    return parser.parse_args()


def group_of(process: Any) -> str:
    try:
        title = " ".join(process.cmdline())
    except Exception:  # ended meanwhile
        return "other"
    for needle, group in GROUPS.items():
        if needle in title:
            return group
    return "driver" if process.pid == os.getpid() else "other ray workers"


def cpu_by_group(processes: list[Any]) -> dict[int, tuple[str, float]]:
    found = {}
    for process in processes:
        try:
            times = process.cpu_times()
        except Exception:  # ended between listing and reading
            continue
        found[process.pid] = (group_of(process), times.user + times.system)
    return found


def make_topic(args: argparse.Namespace) -> None:
    from clients import Producer, ScalableTopicsAdmin, StreamConsumer

    admin = ScalableTopicsAdmin()
    topic = "topic://bench/idle/events"
    admin.create_scalable_topic(topic, args.segments)
    for name in ("a", "b"):
        admin.create_subscription(topic, name)
    with Producer(topic) as producer:
        for i in range(args.messages):
            producer.send(b"x" * 100, key=f"k{i % 1000}")
    consumer = StreamConsumer(topic, "a", "reader")
    received = 0
    deadline = time.monotonic() + 60
    while received < args.messages and time.monotonic() < deadline:
        batch = consumer.receive_batch(5_000, timeout=1)
        if batch:
            consumer.acknowledge_cumulative(batch)
        received += len(batch)
    consumer.close()
    assert received == args.messages, f"read {received} of {args.messages}"


def make_peer(args: argparse.Namespace) -> list[Any]:
    import ray

    @ray.remote(num_cpus=0)
    class Idle:
        async def ping(self) -> int:
            return os.getpid()

    actors = [Idle.remote() for _ in range(args.segments)]
    ray.get([a.ping.remote() for a in actors])
    return actors  # held: an actor whose handle goes away exits


def one_round(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    """In a child process: a fresh Ray, the variant set up, then ``--idle`` s of nothing."""
    import psutil
    import ray

    from runtime.connect import LOCAL_SYSTEM_CONFIG

    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        _system_config=dict(LOCAL_SYSTEM_CONFIG),
    )
    try:
        held = make_topic(args) if variant == "topic" else make_peer(args)
        time.sleep(10)  # stragglers, the first maintenance rounds, hibernation checks
        me = psutil.Process()
        processes = [me, *me.children(recursive=True)]
        before = cpu_by_group(processes)
        time.sleep(args.idle)
        after = cpu_by_group(processes)
        groups: dict[str, float] = {}
        for pid, (group, seconds) in after.items():
            if pid in before:
                groups[group] = groups.get(group, 0.0) + seconds - before[pid][1]
        del held
        share = {g: round(s / args.idle, 4) for g, s in sorted(groups.items())}
        return {
            "variant": variant,
            "processes": len(processes),
            "cores": round(sum(groups.values()) / args.idle, 4),
            "cores_by_group": share,
        }
    finally:
        ray.shutdown()


def main() -> int:
    args = parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if args.variant is not None:
        return print_round("idle-bench-", lambda: one_round(args.variant, args))
    info = machine_info()
    started = time.perf_counter()
    rounds: list[dict[str, Any]] = []
    for _ in range(args.rounds):
        for variant in VARIANTS:
            result = round_in_child(
                __file__,
                *("--variant", variant),
                *("--segments", str(args.segments), "--messages", str(args.messages)),
                *("--idle", str(args.idle)),
            )
            rounds.append(result)
            print(result, flush=True)
    summary = {
        variant: {
            "cores": statistics.median(r["cores"] for r in rounds if r["variant"] == variant),
            "segments_cores": statistics.median(
                r["cores_by_group"].get("segments", 0.0) for r in rounds if r["variant"] == variant
            ),
        }
        for variant in VARIANTS
    }
    print(json.dumps(summary, indent=2))
    settings = {k: getattr(args, k) for k in ("rounds", "segments", "messages", "idle")}
    write_report(
        args.results,
        report("idle", started, info, settings=settings, rounds=rounds, median=summary),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
