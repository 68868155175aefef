"""Leader failover of a replicated topic (factor 3, ackQuorum 2), run by its controller, on
a ``ray.cluster_utils`` cluster of a head and four nodes with a disk each
(``RAYTOPICS_STORAGE_SCOPE=node``).

One producer sends one message at a time (each waits for its acknowledgement), one stream
consumer receives. ``--kills`` (10) times, the node holding the segment's leader is
removed (not gracefully) and, once traffic flows again, a fresh node with an empty disk
joins, so the next loss has a node to move a replica to. Per kill:

* **to the first acknowledged send**: from the removal (its processes gone) to the first
  acknowledgement of a send issued after it (the new leader elected, the producer's
  channel moved to it);
* **to the consumer's first message**: from the removal to the first message received
  that was sent after it.

Both include how long the controller takes to count the leader as lost: at once when its
data plane refuses connections (a killed process), else Ray's node table (a raylet's death
is seen after missed health checks) or the replica's silence past
``RAYTOPICS_REPLICA_GRACE_S`` (``--grace``, 5 s by default, the product's default). A
node may hold the topic's controller too (the namespace's controller host runs on one of
the nodes its placement allows, here those with a disk); then the failover waits for Ray
to restart the controller, once it has declared the node dead. The summary gives both
kinds apart.

A kill SIGKILLs every actor process of the node (the leading segment host among them),
then removes the node; its moment is the SIGKILL (``_remove`` says why not
``remove_node``'s return).

    .venv/bin/python bench/replication_failover.py            # ~2-3 min

Prints a summary and writes bench/results/replication_failover.json.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from _common import machine_info, report, write_report  # noqa: E402

DEFAULT_RESULTS = REPO / "bench" / "results" / "replication_failover.json"
TOPIC = "topic://bench/failover/events"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--grace", type=float, default=5.0)
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    return parser.parse_args()


class Traffic:
    """A producer and a consumer in threads, recording when each send was acknowledged
    and when each message (its send time in its value) was received."""

    def __init__(self) -> None:
        self.acked: list[tuple[float, float]] = []  # (sent at, acknowledged at)
        self.received: list[tuple[float, float]] = []  # (sent at, received at)
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=f) for f in (self._produce, self._consume)]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=120)

    def _produce(self) -> None:
        from clients import Producer

        with Producer(TOPIC) as producer:
            while not self.stop.is_set():
                sent = time.monotonic()
                producer.send(repr(sent).encode(), key="k").result(timeout=120)
                self.acked.append((sent, time.monotonic()))

    def _consume(self) -> None:
        from clients import StreamConsumer

        consumer = StreamConsumer(TOPIC, "s", "c")
        while not self.stop.is_set():
            batch = consumer.receive_batch(500, timeout=0.5)
            now = time.monotonic()
            self.received.extend((float(m.value.decode()), now) for m in batch)
            if batch:
                consumer.acknowledge_cumulative(batch)
        consumer.close()

    def first_after(self, killed: float) -> tuple[float, float]:
        """Seconds from ``killed`` to the first acknowledgement, and to the first message
        received, of a send issued after it (inf: none yet)."""
        ack = min((at for sent, at in self.acked if sent > killed), default=float("inf"))
        got = min((at for sent, at in self.received if sent > killed), default=float("inf"))
        return ack - killed, got - killed


def main() -> None:
    args = parse_args()
    os.environ |= {"RAYTOPICS_STORAGE_SCOPE": "node", "RAY_AUTH_MODE": "disabled"}
    os.environ["RAYTOPICS_REPLICA_GRACE_S"] = str(args.grace)
    os.environ["RAYTOPICS_PLACEMENT"] = '{"bench/*": {"disks": 1}}'
    started, machine = time.perf_counter(), machine_info()
    with tempfile.TemporaryDirectory(prefix="failover-bench-") as scratch:
        os.environ["RAYTOPICS_STORAGE_ROOT"] = f"{scratch}/cluster"
        kills = run(Path(scratch), args)
    summary: dict[str, Any] = {"kills": len(kills), "grace_s": args.grace}
    for part, chosen in (
        ("", kills),
        ("controller_kept_", [k for k in kills if not k["controller_lost"]]),
        ("controller_lost_", [k for k in kills if k["controller_lost"]]),
    ):
        summary[f"{part}kills"] = len(chosen)
        for what in ("to_first_ack", "to_first_read"):
            times = [k[f"{what}_s"] for k in chosen]
            if times:
                summary[f"{part}{what}_p50_s"] = round(statistics.median(times), 2)
                summary[f"{part}{what}_max_s"] = round(max(times), 2)
    del summary["kills"]
    print(summary)
    write_report(args.results, report("replication_failover", started, machine,
                                      summary=summary, kills=kills))  # fmt: skip


def run(scratch: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    import ray
    from ray.cluster_utils import Cluster

    from actors.control.controller_host import controller_actor
    from clients import ScalableTopicsAdmin
    from runtime import connect
    from runtime.names import TopicName
    from storage.durability import NODE_STORAGE_ROOT_ENV

    def node_args(name: str, disk: bool = True) -> dict[str, Any]:
        resources = {"resources": {"disks": 100}} if disk else {}
        root = str(scratch / "disks" / name)
        return {"num_cpus": 1, "env_vars": {NODE_STORAGE_ROOT_ENV: root}, **resources}

    cluster = Cluster(initialize_head=True, head_node_args=node_args("head", disk=False))
    nodes = {cluster.add_node(**node_args(f"n{i}")) for i in range(4)}
    cluster.wait_for_nodes()
    connect(cluster.address, namespace="failover", log_to_driver=False)
    topic = TopicName.parse(TOPIC)
    try:
        admin = ScalableTopicsAdmin()
        admin.set_namespace_policy("bench/failover", {"replication": {"factor": 3}})
        admin.create_scalable_topic(TOPIC, 1)
        admin.create_subscription(TOPIC, "s")

        def replicas() -> list[dict[str, Any]]:
            try:
                status = controller_actor(topic).autoscale_status.remote()
                view = ray.get(status, timeout=10)["replicas"].get("0")
            except Exception:  # noqa: BLE001 - the controller restarting: ask again
                return []
            return view["replicas"] if view else []

        def settled() -> list[dict[str, Any]]:
            """Three replicas in sync, each on a node of the cluster now (a view taken
            before a removal may still list the removed node)."""
            deadline = time.monotonic() + 120
            alive = {n.node_id for n in nodes}
            while not (
                len(found := replicas()) == 3
                and all(r["inSync"] and r["node"] in alive for r in found)
            ):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"replicas never settled: {found}")
                time.sleep(0.2)
            return found

        traffic = Traffic()
        settled()
        traffic.start()
        kills = []
        for i in range(args.kills):
            leader = settled()[0]
            time.sleep(1)
            node = next(n for n in nodes if n.node_id == leader["node"])
            killed, controller_lost = _remove(cluster, node)
            nodes.discard(node)
            while any(x == float("inf") for x in traffic.first_after(killed)):
                if time.monotonic() - killed > 120:
                    raise TimeoutError("no acknowledgement or delivery after a kill")
                time.sleep(0.05)
            ack, read = traffic.first_after(killed)
            nodes.add(cluster.add_node(**node_args(f"m{i}")))  # room for the next loss
            kills.append({"to_first_ack_s": round(ack, 3), "to_first_read_s": round(read, 3),
                          "controller_lost": controller_lost})  # fmt: skip
            print(f"kill {i + 1}: first ack after {ack:.2f}s, first read after {read:.2f}s"
                  + (" (the controller's node)" if controller_lost else ""))  # fmt: skip
        traffic.close()
        return kills
    finally:
        ray.shutdown()
        cluster.shutdown()


def _remove(cluster: Any, node: Any) -> tuple[float, bool]:
    """Remove ``node`` as a machine is lost: every process of it at once, the segment
    host leading the segment included. Returns when they were killed, and whether the
    topic's controller host was among them. ``remove_node``
    alone kills the raylet first and returns only once the rest is reaped (up to 16 s
    later), and a worker outlives its raylet for a while: the old leader kept
    acknowledging meanwhile, which is not a failover."""
    import ray._private.state as state

    workers = [
        a
        for a in state.actors().values()
        if a["State"] == "ALIVE" and a["Address"]["NodeID"] == node.node_id
    ]
    controller_lost = any(a["ActorClassName"].endswith("ControllerHost") for a in workers)
    for pid in (a["Pid"] for a in workers):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    cluster.remove_node(node, allow_graceful=False)
    return killed, controller_lost


if __name__ == "__main__":
    main()
