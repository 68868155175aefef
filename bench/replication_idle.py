"""What an idle replicated topic costs: the CPU of every process of a three-node cluster
while nothing is sent or read, a topic of ``--segments`` (16) segments with three
replicas each (ackQuorum 2) against the same topic with one copy, in the same run.

Each round runs a variant in a child process with a fresh ``ray.cluster_utils`` cluster
(a head and nodes a, b, c of one CPU each, ``RAYTOPICS_STORAGE_SCOPE=node``, a storage
root per node). The topic is created, its namespace given the variant's replication,
``--messages`` (2,000) keyed messages sent and read back by a subscription, and (factor
3) every replica waited for in sync. Then, for ``--idle`` (30) seconds, the CPU seconds of
every process of the machine are summed by what it is (``bench/idle.py``'s groups).
What an idle replicated segment does: its controller's round asks every replica its
status each second, and each follower keeps a fetch waiting at its leader.

    .venv/bin/python bench/replication_idle.py                 # 2 rounds, ~6 min
    .venv/bin/python bench/replication_idle.py --rounds 1 --segments 32

Prints a summary and writes bench/results/replication_idle.json.
"""

from __future__ import annotations

import argparse
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
from idle import cpu_by_group  # noqa: E402

DEFAULT_RESULTS = REPO / "bench" / "results" / "replication_idle.json"
NODES = ("a", "b", "c")
NAMESPACE = "idle/replicated"
TOPIC = f"topic://{NAMESPACE}/events"
VARIANTS = {"factor_1": None, "factor_3_quorum_2": {"factor": 3, "ackQuorum": 2}}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--segments", type=int, default=16)
    parser.add_argument("--messages", type=int, default=2_000)
    parser.add_argument("--idle", type=float, default=30.0)
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)  # in a child
    return parser.parse_args()


def one_round(args: argparse.Namespace) -> dict[str, Any]:
    """In a child process: a fresh cluster, the topic of the variant, then idle CPU."""
    import psutil
    import ray
    from ray.cluster_utils import Cluster

    from clients import Producer, ScalableTopicsAdmin
    from runtime import connect
    from storage.durability import NODE_STORAGE_ROOT_ENV
    from tests.segments import read_keyed

    scratch = Path(tempfile.mkdtemp(prefix="replication-idle-"))
    os.environ["RAYTOPICS_STORAGE_ROOT"] = str(scratch / "cluster")
    os.environ["RAYTOPICS_STORAGE_SCOPE"] = "node"
    os.environ["RAYTOPICS_PLACEMENT"] = json.dumps({f"{NAMESPACE.split('/')[0]}/*": {"disks": 1}})

    def node_args(node: str) -> dict:
        resources = {} if node == "head" else {"resources": {"disks": 100}}
        return {
            "num_cpus": 1,
            "env_vars": {NODE_STORAGE_ROOT_ENV: str(scratch / node)},
            **resources,
        }

    cluster = Cluster(initialize_head=True, head_node_args=node_args("head"))
    for node in NODES:
        cluster.add_node(**node_args(node))
    cluster.wait_for_nodes()
    connect(cluster.address, namespace="replication-idle", log_to_driver=False)
    try:
        admin = ScalableTopicsAdmin()
        replication = VARIANTS[args.variant]
        if replication is not None:
            admin.set_namespace_policy(NAMESPACE, {"replication": replication})
        admin.create_scalable_topic(TOPIC, args.segments)
        admin.create_subscription(TOPIC, "s")
        with Producer(TOPIC) as producer:
            for i in range(args.messages):
                producer.send(f"k{i % 97}:{i}".encode(), key=f"k{i % 97}")
        read = len(read_keyed(TOPIC, "s", args.messages, settle_s=0))
        settled = _in_sync(admin, args.segments, replication) if replication else 0.0
        processes = list(psutil.process_iter())
        before = cpu_by_group(processes)
        time.sleep(args.idle)
        after = cpu_by_group(processes)
        spent: dict[str, float] = {}
        for pid, (group, seconds) in after.items():
            if pid in before:
                spent[group] = spent.get(group, 0.0) + seconds - before[pid][1]
        share = {g: round(100 * s / args.idle, 2) for g, s in sorted(spent.items()) if s > 0}
        return {"read": read, "in_sync_after_s": settled, "core_percent": share,
                "total_core_percent": round(sum(share.values()), 2)}  # fmt: skip
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(scratch, ignore_errors=True)  # gigabytes at peak rates


def _in_sync(admin: Any, segments: int, replication: dict) -> float:
    """Seconds until every segment shows all its replicas in sync (stats)."""
    started = time.monotonic()
    while time.monotonic() - started < 120:
        views = [s.get("replication") for s in admin.get_stats(TOPIC)["segments"].values()]
        if len(views) == segments and all(
            v
            and len(v["replicas"]) == replication["factor"]
            and all(r["inSync"] for r in v["replicas"])
            for v in views
        ):
            return round(time.monotonic() - started, 1)
        time.sleep(1)
    raise TimeoutError("replicas not in sync within 120 s")


def main() -> int:
    args = parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if args.variant:
        print("RESULT", json.dumps(one_round(args)), flush=True)
        return 0
    info = machine_info()
    started = time.perf_counter()
    rounds: list[dict[str, Any]] = []
    options = ("--segments", str(args.segments), "--messages", str(args.messages),
               "--idle", str(args.idle))  # fmt: skip
    for _ in range(args.rounds):
        found = {v: round_in_child(__file__, "--variant", v, *options) for v in VARIANTS}
        print(json.dumps(found), flush=True)
        rounds.append(found)
    median = {v: statistics.median(r[v]["total_core_percent"] for r in rounds) for v in VARIANTS}
    print(json.dumps({"median_total_core_percent": median}, indent=2))
    settings = {k: getattr(args, k) for k in ("rounds", "segments", "messages", "idle")}
    write_report(
        args.results,
        report(
            "replication_idle",
            started,
            info,
            settings=settings,
            rounds=rounds,
            median_total_core_percent=median,
        ),  # fmt: skip
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
