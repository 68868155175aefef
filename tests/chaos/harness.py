"""One chaos run: a multi-node Ray cluster on this machine, a workload
(``tests.chaos.workload``), a seeded fault schedule, then the invariant checker. Run as
``python -m tests.chaos.harness --seed N``; it owns its cluster, so it runs in its own
process. Exit code 0 = no violations.

Workload: an idempotent producer sending keyed messages ``key:seq``; a stream
consumer that never crashes (checked exactly once, per-key order); a queue
consumer in a process of its own (checked at least once). Faults: the node
holding the controller or a segment is removed (and a fresh node added), the
coordinator is killed, the queue consumer's process is SIGKILLed and replaced
(what it held comes back after the ack timeout), segments split and merge. An
actor on the head node is killed as a process instead (the head holds the GCS).
``--replicated``: the same with replicated segments (``tests.chaos.replicated``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tests.chaos.workload import (
    QueueConsumerProcess,
    Run,
    Shape,
    finish_workload,
    one_cpu,
    start_workload,
)

FAULTS = ("controller_node", "segment_node", "coordinator", "consumer", "split", "merge")
REPLICAS_RESTORED_S = 90
LEADER_FOUND_S = 30


def schedule(
    seed: int, duration_s: float, faults: tuple[str, ...] = FAULTS
) -> list[tuple[float, str]]:
    """The seeded fault schedule: (seconds after start, fault), printed for replay."""
    rng = random.Random(seed)
    count = max(3, int(duration_s / 5))
    times = sorted(round(rng.uniform(2, duration_s - 2), 2) for _ in range(count))
    return [(t, rng.choice(faults)) for t in times]


class Faults:
    """Carries out scheduled faults against the cluster, each in a thread of its own.

    Faults overlap as they would in production (a split still running when a
    node dies), and a slow one (a node start on a loaded machine) does not push
    the rest of the schedule back. Each draws its choices from its own seeded
    generator, so thread timing does not change which segment a fault picks.
    """

    def __init__(
        self,
        cluster: Any,
        run: Run,
        rng: random.Random,
        queue: QueueConsumerProcess,
        shape: Shape,
    ) -> None:
        """``shape.node_args``: what a node added in place of a removed one is started
        with; a replicated ``shape.policy`` makes node losses come one at a time."""
        from clients import ScalableTopicsAdmin

        self.cluster, self.run, self.rng, self.queue = cluster, run, rng, queue
        self.node_args = shape.node_args
        self.factor = ((shape.policy or {}).get("replication") or {}).get("factor", 1)
        self.admin = ScalableTopicsAdmin(controller_restart_timeout_s=120)
        self.nodes_lock = threading.Lock()  # Cluster is not thread-safe
        # Node faults wait for the replicas lost to the one before, then remove a node: one
        # at a time, or two threads would both see the replicas in sync and both remove.
        self.node_faults = threading.Lock()
        self.missing_nodes = 0
        self.removed: set[str] = set()  # node ids
        self.threads: list[threading.Thread] = []

    def start(self, fault: str) -> None:
        args = (fault, random.Random(self.rng.random()))
        thread = threading.Thread(target=self.inject, args=args, daemon=True)
        thread.start()
        self.threads.append(thread)

    def wait_until(self, deadline: float) -> None:
        """Sleep until ``deadline`` (monotonic), replacing removed nodes meanwhile."""
        while (remaining := deadline - time.monotonic()) > 0:
            self.replace_nodes()
            time.sleep(min(remaining, 0.2))

    def join(self, timeout_s: float) -> None:
        for thread in self.threads:
            thread.join(timeout_s)
        self.replace_nodes()

    def replace_nodes(self) -> None:
        """Add a fresh node per removed one. Main thread only: starting a Ray node
        installs signal handlers. On a loaded machine Ray may give up waiting for a
        node to register (30 s); it is then tried again later."""
        with self.nodes_lock:
            while self.missing_nodes:
                try:
                    self.cluster.add_node(**self.node_args())
                except Exception as err:  # noqa: BLE001 - Ray raises a bare Exception here
                    print(f"  [{time.strftime('%X')}] could not add a fresh node: {err}")
                    return
                self.missing_nodes -= 1

    def inject(self, fault: str, rng: random.Random) -> None:
        action: Callable[[random.Random], str] = getattr(self, f"_{fault}")
        try:
            outcome = f"{fault}: {action(rng)}"
        except Exception as err:  # a refused split/merge is fine; it is reported
            outcome = f"{fault}: refused ({type(err).__name__}: {err})"
        self.run.faults.append(outcome)
        print(f"  [{time.strftime('%X')}] {outcome}", flush=True)

    def _kill_node_of(self, actor_name: str) -> str | None:
        """Remove the node of the actor ``actor_name`` (kill it, on the head node); None
        when it is not alive now or its node is gone already (the GCS has not seen it go
        yet): the caller looks again."""
        import ray

        from runtime.config import ray_namespace

        with self.nodes_lock:
            alive = [a for a in alive_actors() if a["Name"] == actor_name]
            if not alive:
                return None
            node_id = alive[0]["Address"]["NodeID"]
            node = next((n for n in self.cluster.worker_nodes if n.node_id == node_id), None)
            if node is not None:
                self.cluster.remove_node(node, allow_graceful=False)
                self.missing_nodes += 1
                self.removed.add(node_id)
                return f"removed node {node_id[:8]} holding {actor_name} (to be replaced)"
            if node_id != self.cluster.head_node.node_id:
                return None
        ray.kill(ray.get_actor(actor_name, namespace=ray_namespace()), no_restart=False)
        return f"{actor_name} is on the head node: killed its process"

    def _replicas_restored(self) -> str:
        """Wait until every replicated segment still served (the active ones, and sealed
        ones whose backlog readers still read) has all its replicas in sync again. The
        guarantee of a factor F with ack quorum Q is the loss of F-Q nodes at a time:
        a second loss before the first one's replicas are replaced may leave a segment
        too few replicas to elect a leader (it then waits for a lost node to come back,
        and these never do: a replacement has a fresh disk)."""
        import ray

        from actors.control.controller_host import controller_actor
        from runtime.names import TopicName

        if self.factor == 1:
            return ""
        topic = TopicName.parse(self.run.topic)
        started = time.monotonic()
        while (waited := time.monotonic() - started) < REPLICAS_RESTORED_S:
            try:
                active = {str(i) for i in self.admin.get_layout(self.run.topic).active_segments}
                status = ray.get(controller_actor(topic).autoscale_status.remote(), timeout=10)
                views = status["replicas"]
                if active <= set(views) and all(map(self._restored, views.values())):
                    return f"after {waited:.1f} s for every replica in sync, " if waited > 1 else ""
            except Exception:  # noqa: BLE001, S110 - a controller restarting: ask again
                pass
            time.sleep(0.5)
        return f"replicas not in sync after {REPLICAS_RESTORED_S} s, "

    def _restored(self, view: dict[str, Any] | None) -> bool:
        """All of a segment's replicas in sync, none on a node removed (a round that
        ran before the controller saw a node go still shows its replicas in sync)."""
        return (
            view is not None
            and len(view["replicas"]) == self.factor
            and all(r["inSync"] and r["node"] not in self.removed for r in view["replicas"])
        )

    def _controller_node(self, _rng: random.Random) -> str:
        from actors.controller_directory import ControllerDirectory
        from runtime.names import TopicName

        with self.node_faults:
            waited = self._replicas_restored()
            entry = ControllerDirectory().get(TopicName.parse(self.run.topic))
            if entry is None:
                return waited + "no controller runs"
            return waited + (self._kill_node_of(entry.host) or f"{entry.host} not alive")

    def _segment_node(self, rng: random.Random) -> str:
        """Remove the node whose segment host leads a segment active now. A choice made as
        a split or merge ends, or as a host restarts, may find no live leader: chosen
        again, for up to ``LEADER_FOUND_S``, so that the schedule's fault takes place."""
        with self.node_faults:
            return self._remove_a_leaders_node(rng)

    def _remove_a_leaders_node(self, rng: random.Random) -> str:
        from actors.segment.directory import SegmentDirectory
        from runtime.errors import ScalableTopicsError
        from runtime.names import TopicName

        waited = self._replicas_restored()
        deadline = time.monotonic() + LEADER_FOUND_S
        why = "none found"
        while time.monotonic() < deadline:
            try:  # the layout's answer may wait for a controller that restarts
                layout = self.admin.get_layout(self.run.topic)
            except ScalableTopicsError as err:
                why = f"{type(err).__name__}: {err}"
                time.sleep(0.5)
                continue
            info = rng.choice(list(layout.active_segments.values()))
            name = TopicName.parse(self.run.topic).segment(
                info.segment_id, info.hash_range.start, info.hash_range.end
            )
            entry = SegmentDirectory().get(name)  # the segment's host process
            outcome = self._kill_node_of(entry.host) if entry else None
            if outcome is not None:
                return waited + outcome
            time.sleep(0.5)
        return waited + f"no live leader of an active segment in {LEADER_FOUND_S} s ({why})"

    def _coordinator(self, _rng: random.Random) -> str:
        import ray

        from actors.control.coordinator_host import coordinator_actor
        from runtime.names import TopicName

        coordinator = coordinator_actor(TopicName.parse(self.run.topic), "stream")
        ray.kill(coordinator.host, no_restart=False)
        return "killed the namespace's coordinator host (the stream subscription's coordinator)"

    def _consumer(self, _rng: random.Random) -> str:
        self.queue.crash()
        return "killed the queue consumer's process, started another"

    def _split(self, rng: random.Random) -> str:
        layout = self.admin.get_layout(self.run.topic)
        wide = [s for s in layout.active_segments.values() if s.hash_range.end > s.hash_range.start]
        target = rng.choice(wide).segment_id
        return f"split {target}: {self.admin.split_segment(self.run.topic, target)['children']}"

    def _merge(self, rng: random.Random) -> str:
        layout = self.admin.get_layout(self.run.topic)
        active = sorted(layout.active_segments.values(), key=lambda s: s.hash_range.start)
        if len(active) < 2:
            return "only one active segment"
        i = rng.randrange(len(active) - 1)
        a, b = active[i].segment_id, active[i + 1].segment_id
        return f"merge {a}+{b}: {self.admin.merge_segments(self.run.topic, a, b)['children']}"


def alive_actors() -> list[dict[str, Any]]:
    """Alive actors from the GCS directly (the state API needs a dashboard)."""
    import ray._private.state as state

    return [a for a in state.actors().values() if a["State"] == "ALIVE"]


def actor_memory() -> dict[tuple[str, int], int]:
    """RSS bytes of every alive named actor, by (name, pid): a restart is a new entry."""
    import psutil

    sizes = {}
    for actor in alive_actors():
        try:
            process = psutil.Process(actor["Pid"])
            if process.status() != psutil.STATUS_ZOMBIE:  # dead with its node, not reaped
                sizes[(actor["Name"], actor["Pid"])] = process.memory_info().rss
        except (psutil.Error, KeyError):
            continue
    return sizes


def start_cluster(
    nodes: int,
    head_resources: dict[str, float] | None = None,
    node_args: Callable[[], dict[str, Any]] = one_cpu,
) -> Any:
    """The head (never removed: it holds the GCS) plus ``nodes`` workers, each started
    with ``node_args()`` (one CPU)."""
    from ray.cluster_utils import Cluster

    system = {"health_check_period_ms": 1000, "health_check_failure_threshold": 10}
    head = {"num_cpus": 1, "include_dashboard": False, "_system_config": system}
    cluster = Cluster(initialize_head=True, head_node_args={**head, "resources": head_resources})
    for _ in range(nodes):
        cluster.add_node(**node_args())
    cluster.wait_for_nodes()
    return cluster


def seeds(spec: str) -> list[int]:
    """``1-10``, ``7`` or ``6,13``: the seeds to run, in order."""
    found = []
    for part in spec.split(","):
        first, _, last = part.partition("-")
        found += range(int(first), int(last or first) + 1)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", default=str(random.randrange(1 << 30)), help="1-10, 7 or 6,13")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of load + faults")
    parser.add_argument("--rate", type=float, default=150.0, help="messages per second")
    parser.add_argument("--nodes", type=int, help="workers beside the head: 3, or 4 replicated")
    parser.add_argument("--replicated", action="store_true", help="see chaos/replicated.py")
    args = parser.parse_args(argv)
    failed = 0
    shape, faults, nodes = Shape(), FAULTS, args.nodes or 3
    if args.replicated:
        from tests.chaos import replicated

        root = Path(os.environ.get("RAYTOPICS_STORAGE_ROOT") or tempfile.mkdtemp()) / "disks"
        shape, faults = replicated.replicated_shape(root), replicated.FAULTS
        nodes = args.nodes or replicated.NODES
    with chaos_cluster(nodes, node_args=shape.node_args) as cluster:
        for seed in seeds(args.seeds):
            plan = schedule(seed, args.duration, faults)
            print(f"chaos seed={seed} schedule={json.dumps(plan)}", flush=True)
            result = run_chaos(cluster, seed, plan, args.duration, args.rate, shape=shape)
            print(json.dumps(result), flush=True)
            failed += bool(result["violations"])
    return 1 if failed else 0


@contextlib.contextmanager
def chaos_cluster(
    nodes: int,
    head_resources: dict[str, float] | None = None,
    node_args: Callable[[], dict[str, Any]] = one_cpu,
) -> Iterator[Any]:
    """One multi-node cluster for a series of runs (starting one costs tens of seconds)."""
    os.environ.setdefault("RAYTOPICS_STORAGE_ROOT", tempfile.mkdtemp(prefix="raytopics-chaos-"))
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # a killed queue consumer's messages come back after this, not the default 30 s
    os.environ.setdefault("RAYTOPICS_ACK_TIMEOUT_S", "5")
    import ray

    from runtime import connect

    cluster = start_cluster(nodes, head_resources, node_args)
    try:
        connect(cluster.address, namespace=f"chaos-{os.getpid()}", log_to_driver=False)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def run_chaos(
    cluster: Any,
    seed: int,
    plan: list[tuple[float, str]],
    duration_s: float,
    rate: float,
    retention_s: float | None = None,
    shape: Shape | None = None,
) -> dict[str, Any]:
    """One seed's workload and faults on its own topic, then the checks."""
    shape = shape or Shape()
    topic = f"topic://chaos/s{seed}-{os.getpid()}/events"
    workload = start_workload(cluster, topic, rate, retention_s, shape)
    rng = random.Random(seed)
    faults = Faults(cluster, workload.run, rng, workload.queue, shape)
    t0 = time.monotonic()
    for at, fault in plan:
        faults.wait_until(t0 + at)
        faults.start(fault)
    faults.wait_until(t0 + duration_s)
    faults.join(timeout_s=240)
    return {"seed": seed, **finish_workload(workload)}


if __name__ == "__main__":
    sys.exit(main())
