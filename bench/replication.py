"""A segment replicated three times (ackQuorum 2) against the same segment unreplicated,
in the same rounds, on a ``ray.cluster_utils`` cluster of three nodes with a disk each.

Each round runs in a child process with a fresh cluster (head + nodes a, b, c, one CPU
each, ``RAYTOPICS_STORAGE_SCOPE=node``, a storage root per node). The leader is on a; the
replicated segment's followers on b and c pull from it over the data plane
(``actors.segment.replication``). The roles are given by hand, as the controller gives
them: this measures the data path, not placement or failover.

One producer in the driver appends over the data plane (``SegmentChannel``), batches of
``--batch`` (100) records of 100 bytes, sequenced, at most ``--window`` (64) in flight:

* **peak**: as fast as answers come, for ``--seconds`` (5);
* **half load**: half the *unreplicated* peak, offered to both, each append's time
  from its send to its answer (p50, p99);
* **half its own peak**: the replicated segment at half of its own peak, where it is not
  over its capacity (the unreplicated one's is the phase above).

The durability is the default (``interval``). Where the time goes: the machine's busy
CPU seconds per million messages in each phase (``/proc/stat``: every process, the
three replicas' hosts included), since one machine holding three replicas does three
times the disk and copy work of one.

Leader failover (node kill to the first acknowledged send on the new leader) is
``bench/replication_failover.py``'s.

    .venv/bin/python bench/replication.py            # 2 rounds, ~2 min

Prints a summary and writes bench/results/replication.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from _common import machine_info, report, round_in_child, write_report  # noqa: E402

DEFAULT_RESULTS = REPO / "bench" / "results" / "replication.json"
NODES = ("a", "b", "c")
PHASES = ("peak", "half_load", "half_own_peak")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    parser.add_argument("--round", action="store_true", help=argparse.SUPPRESS)  # in a child
    return parser.parse_args()


def busy_cpu_s() -> float:
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


class Appender:
    """One sequenced producer over the data plane of a segment's leader."""

    def __init__(self, handle: Any, batch: int) -> None:
        from clients._data_plane import SegmentChannel
        from runtime.batch import make_batch, serialize_batch

        self.channel = SegmentChannel(handle)
        self.payload = serialize_batch(make_batch([b"x" * 100] * batch))
        self.batch, self.sequence = batch, 0

    async def append(self) -> float:
        """One append; its seconds from send to answer."""
        sequence, self.sequence = self.sequence, self.sequence + 1
        started = time.perf_counter()
        await self.channel.append("bench", sequence, self.payload)
        return time.perf_counter() - started

    async def peak(self, seconds: float, window: int) -> dict[str, float]:
        slots, done = asyncio.Semaphore(window), 0
        cpu, started = busy_cpu_s(), time.perf_counter()
        deadline = started + seconds

        async def one() -> None:
            nonlocal done
            try:
                await self.append()
                done += 1
            finally:
                slots.release()

        tasks = []
        while time.perf_counter() < deadline:
            await slots.acquire()
            tasks.append(asyncio.create_task(one()))
        await asyncio.gather(*tasks)
        elapsed, messages = time.perf_counter() - started, done * self.batch
        return {
            "msgs_per_s": round(messages / elapsed),
            "cpu_s_per_million_msgs": round((busy_cpu_s() - cpu) / messages * 1e6, 2),
        }

    async def paced(self, msgs_per_s: float, seconds: float) -> dict[str, float]:
        interval = self.batch / msgs_per_s
        cpu, started = busy_cpu_s(), time.perf_counter()
        tasks, count = [], int(seconds / interval)
        for i in range(count):
            await asyncio.sleep(max(0.0, started + i * interval - time.perf_counter()))
            tasks.append(asyncio.create_task(self.append()))
        latencies = sorted(await asyncio.gather(*tasks))
        messages = count * self.batch
        return {
            "offered_msgs_per_s": round(msgs_per_s),
            "p50_ms": round(statistics.median(latencies) * 1000, 2),
            "p99_ms": round(latencies[int(len(latencies) * 0.99) - 1] * 1000, 2),
            "cpu_s_per_million_msgs": round((busy_cpu_s() - cpu) / messages * 1e6, 2),
        }


def one_round(args: argparse.Namespace) -> dict[str, Any]:
    """In a child process: a fresh three-node cluster, both segments, both phases."""
    import ray
    from ray.cluster_utils import Cluster

    from actors.segment.host import start_segment_actor
    from runtime import connect
    from runtime.names import SegmentName
    from storage.durability import NODE_STORAGE_ROOT_ENV
    from storage.topic_storage import new_incarnation

    scratch = Path(tempfile.mkdtemp(prefix="replication-bench-"))
    os.environ["RAYTOPICS_STORAGE_ROOT"] = str(scratch / "cluster")
    os.environ["RAYTOPICS_STORAGE_SCOPE"] = "node"

    def node_args(node: str) -> dict:
        return {"num_cpus": 1, "env_vars": {NODE_STORAGE_ROOT_ENV: str(scratch / node)}}

    cluster = Cluster(initialize_head=True, head_node_args=node_args("head"))
    nodes = {name: cluster.add_node(**node_args(name)).node_id for name in NODES}
    cluster.wait_for_nodes()
    connect(cluster.address, namespace="replication-bench", log_to_driver=False)
    try:

        def segment(label: str, factor: int) -> Any:
            name = SegmentName.parse(f"segment://bench/replication/{label}/0000-ffff-0")
            incarnation = new_incarnation()
            handles = [
                start_segment_actor(
                    name, initialize=True, incarnation=incarnation, node=nodes[node], replica=i > 0
                )  # fmt: skip
                for i, node in enumerate(NODES[:factor])
            ]
            if factor > 1:
                ray.get(handles[0].lead.remote(1, factor, factor // 2 + 1))
                endpoint = ray.get(handles[0].data_endpoint.remote())
                ray.get([h.follow.remote(1, endpoint) for h in handles[1:]])
            ray.get(handles[0].ready.remote())
            return handles[0]

        async def measure() -> dict[str, Any]:
            plain = Appender(segment("plain", 1), args.batch)
            replicated = Appender(segment("replicated", 3), args.batch)
            for appender in (plain, replicated):  # connections open, first batches stored
                await asyncio.gather(*(appender.append() for _ in range(10)))
            found: dict[str, Any] = {"factor_1": {}, "factor_3_quorum_2": {}}
            found["factor_1"]["peak"] = await plain.peak(args.seconds, args.window)
            found["factor_3_quorum_2"]["peak"] = await replicated.peak(args.seconds, args.window)
            half = found["factor_1"]["peak"]["msgs_per_s"] / 2
            found["factor_1"]["half_load"] = await plain.paced(half, args.seconds)
            found["factor_3_quorum_2"]["half_load"] = await replicated.paced(half, args.seconds)
            # Each at half of its own peak: what replication adds to an append's time where
            # neither is over its capacity (half the unreplicated peak can be more than the
            # replicated one, and then appends queue). Unreplicated, that is the phase above.
            own = found["factor_3_quorum_2"]["peak"]["msgs_per_s"] / 2
            found["factor_1"]["half_own_peak"] = found["factor_1"]["half_load"]
            found["factor_3_quorum_2"]["half_own_peak"] = await replicated.paced(own, args.seconds)
            return found

        return asyncio.run(measure())
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(scratch, ignore_errors=True)  # gigabytes at peak rates


def main() -> int:
    args = parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if args.round:
        print("RESULT", json.dumps(one_round(args)), flush=True)
        return 0
    info = machine_info()
    started = time.perf_counter()
    rounds = []
    for _ in range(args.rounds):
        options = ("--seconds", str(args.seconds), "--batch", str(args.batch))
        rounds.append(round_in_child(__file__, "--round", *options, "--window", str(args.window)))
        print(json.dumps(rounds[-1]), flush=True)
    median = {
        config: {
            phase: {
                key: statistics.median(r[config][phase][key] for r in rounds)
                for key in rounds[0][config][phase]
            }  # fmt: skip
            for phase in PHASES
        }
        for config in rounds[0]
    }
    plain, replicated = median["factor_1"], median["factor_3_quorum_2"]
    ratios = {
        "peak_throughput": round(replicated["peak"]["msgs_per_s"] / plain["peak"]["msgs_per_s"], 2),
        **{
            f"{phase}_p99": round(replicated[phase]["p99_ms"] / plain[phase]["p99_ms"], 2)
            for phase in PHASES[1:]
        },
    }
    print(json.dumps({"median": median, "replicated_over_plain": ratios}, indent=2))
    settings = {k: getattr(args, k) for k in ("rounds", "seconds", "batch", "window")}
    write_report(
        args.results,
        report(
            "replication",
            started,
            info,
            settings=settings,
            rounds=rounds,
            median=median,
            replicated_over_plain=ratios,
        ),  # fmt: skip
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
