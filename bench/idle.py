"""What an idle topic costs: the CPU of every process while nothing is sent or read.

Issue 47's goal is a topic of 32 idle segments at under 5% of one core, Ray's own
processes included. Each round starts a fresh embedded Ray (``runtime.connect``, as a program
gets it, with its system settings and environment) in a child process and measures, over
``--idle`` (60) seconds, the CPU seconds of every process of that Ray, grouped by
what it is, and the CPU of the segment processes' threads, grouped by thread (the
main thread apart: it runs Ray's task loop). For each of ``--segments`` (1, 32, 128),
two variants alternate:

- ``topic``: a topic of that many segments with two subscriptions, written to
  (``--messages`` sends) and read by a stream consumer that then closes, so every
  segment has flushed, served reads and been maintained before it goes quiet; no
  hibernation policy, so every segment keeps its process;
- ``peer``: as many trivial async Ray actors, each a process that does nothing: the
  floor any design with one process per segment pays on this Ray.

    .venv/bin/python bench/idle.py                          # 2 rounds of each, ~25 min
    .venv/bin/python bench/idle.py --segments 32 --rounds 1

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
    "ray::SegmentHost": "segments",
    "ray::Idle": "segments",  # the peer's stand-ins
    "ray::ControllerHost": "controller",
    "ray::CoordinatorHost": "coordinators",
    "ray::DagWatchServer": "dag watch",
    "ray::AdminService": "admin service",
    "gcs_server": "gcs",
    "raylet": "raylet",
    "ray::DashboardAgent": "dashboard agent",
    "ray::RuntimeEnvAgent": "ray agents",
    "ray::IDLE": "pooled idle workers",
    "dashboard": "ray agents",
    "runtime_env": "ray agents",
    "log_monitor": "ray agents",
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--segments", type=int, nargs="+", default=[1, 32, 128])
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


def thread_cpu(processes: list[Any]) -> dict[tuple[int, int], tuple[str, float]]:
    """CPU seconds of every thread of ``processes``, labelled by its name (Ray names its
    C++ threads; Python's threads keep the process's title, so they share a label)."""
    found = {}
    for process in processes:
        try:
            threads = process.threads()
        except Exception:  # ended meanwhile
            continue
        for thread in threads:
            try:
                name = Path(f"/proc/{process.pid}/task/{thread.id}/comm").read_text().strip()
            except OSError:
                continue
            label = "main thread (Ray's task loop)" if thread.id == process.pid else name
            found[process.pid, thread.id] = (label, thread.user_time + thread.system_time)
    return found


def cpu_by_group(processes: list[Any]) -> dict[int, tuple[str, float]]:
    found = {}
    for process in processes:
        try:
            times = process.cpu_times()
        except Exception:  # ended between listing and reading
            continue
        found[process.pid] = (group_of(process), times.user + times.system)
    return found


def make_topic(args: argparse.Namespace, count: int) -> None:
    from clients import Producer, ScalableTopicsAdmin, StreamConsumer

    admin = ScalableTopicsAdmin()
    topic = "topic://bench/idle/events"
    admin.create_scalable_topic(topic, count)
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


def make_peer(count: int) -> list[Any]:
    import ray

    @ray.remote(num_cpus=0)
    class Idle:
        async def ping(self) -> int:
            return os.getpid()

    actors = [Idle.remote() for _ in range(count)]
    ray.get([a.ping.remote() for a in actors])
    return actors  # held: an actor whose handle goes away exits


def one_round(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    """In a child process: a fresh Ray, the variant set up, then ``--idle`` s of nothing."""
    import tempfile

    import psutil

    from runtime.connect import connect, disconnect

    # Admission's CPU share per segment is not what is measured: 128 segments on 2 CPUs.
    os.environ["RAYTOPICS_SEGMENTS_PER_CPU"] = "128"
    # The embedded Ray as a program gets it (its settings and environment), of a storage
    # root of its own, so its processes are this process's children.
    os.environ["RAYTOPICS_STORAGE_ROOT"] = tempfile.mkdtemp(prefix="idle-bench-")
    connect("local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        count = args.segments[0]
        held = make_topic(args, count) if variant == "topic" else make_peer(count)
        time.sleep(10)  # stragglers, the first maintenance rounds, hibernation checks
        me = psutil.Process()
        processes = [me, *me.children(recursive=True)]
        before = cpu_by_group(processes)
        segments = [p for p in processes if before.get(p.pid, ("",))[0] == "segments"]
        threads_before = thread_cpu(segments)
        time.sleep(args.idle)
        after = cpu_by_group(processes)
        threads_after = thread_cpu(segments)
        del held
        spent = _spent(before, after)
        return {
            "variant": variant,
            "segments": count,
            "processes": len(processes),
            "cores": round(sum(spent.values()) / args.idle, 4),
            "cores_by_group": _share(spent, args.idle),
            # per segment process, in ms of CPU a second
            "segment_thread_ms_per_s": {
                label: round(seconds / args.idle / max(len(segments), 1) * 1000, 2)
                for label, seconds in _share(_spent(threads_before, threads_after), 1).items()
            },
        }
    finally:
        disconnect()


def _spent(
    before: dict[Any, tuple[str, float]], after: dict[Any, tuple[str, float]]
) -> dict[str, float]:
    """CPU seconds spent between two samples, by label (entries in both samples only)."""
    spent: dict[str, float] = {}
    for key, (label, seconds) in after.items():
        if key in before:
            spent[label] = spent.get(label, 0.0) + seconds - before[key][1]
    return spent


def _share(spent: dict[str, float], seconds: float) -> dict[str, float]:
    return {label: round(s / seconds, 4) for label, s in sorted(spent.items()) if s > 0}


def main() -> int:
    args = parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if args.variant is not None:
        return print_round("idle-bench-", lambda: one_round(args.variant, args))
    info = machine_info()
    started = time.perf_counter()
    rounds: list[dict[str, Any]] = []
    for count in args.segments:
        for _ in range(args.rounds):
            for variant in VARIANTS:
                result = round_in_child(
                    __file__,
                    *("--variant", variant),
                    *("--segments", str(count), "--messages", str(args.messages)),
                    *("--idle", str(args.idle)),
                )
                rounds.append(result)
                print(result, flush=True)
    summary = {
        f"{variant} {count}": _median_of(
            [r for r in rounds if r["variant"] == variant and r["segments"] == count]
        )
        for count in args.segments
        for variant in VARIANTS
    }
    print(json.dumps(summary, indent=2))
    settings = {k: getattr(args, k) for k in ("rounds", "segments", "messages", "idle")}
    write_report(
        args.results,
        report("idle", started, info, settings=settings, rounds=rounds, median=summary),
    )
    return 0


def _median_of(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over rounds: whole Ray, each process group, each segment thread label."""

    def median(field: str, key: str | None = None) -> float:
        values = [r[field] if key is None else r[field].get(key, 0.0) for r in rounds]
        return round(statistics.median(values), 4)

    groups = sorted({g for r in rounds for g in r["cores_by_group"]})
    threads = sorted({t for r in rounds for t in r["segment_thread_ms_per_s"]})
    return {
        "cores": median("cores"),
        "cores_by_group": {g: median("cores_by_group", g) for g in groups},
        "segment_thread_ms_per_s": {t: median("segment_thread_ms_per_s", t) for t in threads},
    }


if __name__ == "__main__":
    sys.exit(main())
