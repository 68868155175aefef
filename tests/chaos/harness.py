"""One chaos run: a multi-node Ray cluster on this machine, a workload, a seeded fault
schedule, then the invariant checker. Run as ``python -m tests.chaos.harness --seed N``;
it owns its cluster, so it runs in its own process. Exit code 0 = no violations.

Workload: an idempotent producer sending keyed messages ``key:seq``; a stream
consumer that never crashes (checked exactly once, per-key order); a queue
consumer in a process of its own (checked at least once). Faults: the node
holding the controller or a segment is removed (and a fresh node added), the
coordinator is killed, the queue consumer's process is SIGKILLed and replaced
(what it held comes back after the ack timeout), segments split and merge. An
actor on the head node is killed as a process instead (the head holds the GCS).
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
from dataclasses import dataclass, field
from typing import Any

FAULTS = ("controller_node", "segment_node", "coordinator", "consumer", "split", "merge")
KEYS = 16


@dataclass
class Run:
    """Shared state of one run; the threads append, the checker reads."""

    topic: str
    acked: list[tuple[str, int]] = field(default_factory=list)
    stream: list[tuple[str, int]] = field(default_factory=list)
    queue: list[tuple[str, int]] = field(default_factory=list)
    stop_producing: threading.Event = field(default_factory=threading.Event)
    stop_consuming: threading.Event = field(default_factory=threading.Event)
    errors: list[str] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)


def schedule(seed: int, duration_s: float) -> list[tuple[float, str]]:
    """The seeded fault schedule: (seconds after start, fault), printed for replay."""
    rng = random.Random(seed)
    count = max(3, int(duration_s / 5))
    times = sorted(round(rng.uniform(2, duration_s - 2), 2) for _ in range(count))
    return [(t, rng.choice(FAULTS)) for t in times]


def _decode(value: bytes) -> tuple[str, int]:
    key, seq = value.decode().split(":")
    return key, int(seq)


def produce(run: Run, rate: float) -> None:
    from clients import Producer

    seqs = dict.fromkeys((f"k{i}" for i in range(KEYS)), 0)
    pending: list[tuple[Any, tuple[str, int]]] = []
    with Producer(run.topic, send_timeout_s=120) as producer:
        i = 0
        while not run.stop_producing.is_set():
            key = f"k{i % KEYS}"
            pending.append(
                (producer.send(f"{key}:{seqs[key]}".encode(), key=key), (key, seqs[key]))
            )
            seqs[key] += 1
            i += 1
            time.sleep(1 / rate)
        producer.flush(timeout_s=180)
    for future, message in pending:
        try:
            future.result(timeout=0)
            run.acked.append(message)
        except Exception as err:  # not acked: allowed to be lost, but must be rare
            run.errors.append(f"send {message} failed: {type(err).__name__}")


def consume_stream(run: Run) -> None:
    from clients import StreamConsumer

    consumer = StreamConsumer(run.topic, "stream", "c1")
    while not run.stop_consuming.is_set():
        message = consumer.receive(timeout=0.5)
        if message is not None:
            run.stream.append(_decode(message.value))
            consumer.acknowledge_cumulative(message)
    consumer.close()


def queue_consumer_process(topic: str, address: str, namespace: str, out: Any, stop: Any) -> None:
    """A queue consumer in a process of its own, so that a crash is a real process death.

    Each value goes down the pipe (a synchronous write) before it is acknowledged:
    a message acked but unrecorded would be a false loss.
    """
    from clients import QueueConsumer
    from runtime import connect

    connect(address, namespace=namespace, log_to_driver=False)
    consumer = QueueConsumer(topic, "queue")
    while not stop.is_set():
        message = consumer.receive(timeout=0.5)
        if message is not None:
            out.send_bytes(message.value)
            consumer.acknowledge(message)
    consumer.close()


class QueueConsumerProcess:
    """Runs ``queue_consumer_process`` and records what it delivers into ``run.queue``;
    ``crash`` SIGKILLs it (no ack flushed, no goodbye to the segments) and starts another."""

    def __init__(self, run: Run, address: str) -> None:
        import multiprocessing

        self.run, self.address = run, address
        self.context = multiprocessing.get_context("spawn")
        self.stop = self.context.Event()
        self.process: Any = None
        self.recorders: list[threading.Thread] = []
        self.lock = threading.Lock()

    def start(self) -> None:
        import ray

        receive, send = self.context.Pipe(duplex=False)
        namespace = ray.get_runtime_context().namespace
        args = (self.run.topic, self.address, namespace, send, self.stop)
        self.process = self.context.Process(target=queue_consumer_process, args=args, daemon=True)
        self.process.start()
        send.close()  # the child holds the only writer: its death ends the recorder
        recorder = threading.Thread(target=self._record, args=(receive,), daemon=True)
        recorder.start()
        self.recorders.append(recorder)

    def _record(self, receive: Any) -> None:
        with contextlib.suppress(EOFError, OSError):
            while True:
                self.run.queue.append(_decode(receive.recv_bytes()))

    def crash(self) -> None:
        with self.lock:  # two scheduled crashes may overlap
            self.process.kill()
            self.process.join()
            self.start()

    def finish(self, timeout_s: float) -> None:
        self.stop.set()
        self.process.join(timeout_s)
        if self.process.is_alive():
            self.process.kill()
        for recorder in self.recorders:
            recorder.join(timeout_s)


class Faults:
    """Carries out scheduled faults against the cluster, each in a thread of its own.

    Faults overlap as they would in production (a split still running when a
    node dies), and a slow one (a node start on a loaded machine) does not push
    the rest of the schedule back. Each draws its choices from its own seeded
    generator, so thread timing does not change which segment a fault picks.
    """

    def __init__(
        self, cluster: Any, run: Run, rng: random.Random, queue: QueueConsumerProcess
    ) -> None:
        from clients import ScalableTopicsAdmin

        self.cluster, self.run, self.rng, self.queue = cluster, run, rng, queue
        self.admin = ScalableTopicsAdmin(controller_restart_timeout_s=120)
        self.nodes_lock = threading.Lock()  # Cluster is not thread-safe
        self.missing_nodes = 0
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
                    self.cluster.add_node(num_cpus=1)
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

    def _kill_node_of(self, actor_name: str) -> str:
        import ray

        from runtime.config import ray_namespace

        with self.nodes_lock:
            alive = [a for a in alive_actors() if a["Name"] == actor_name]
            if not alive:
                return f"{actor_name} not alive"
            node_id = alive[0]["Address"]["NodeID"]
            node = next((n for n in self.cluster.worker_nodes if n.node_id == node_id), None)
            if node is not None:
                self.cluster.remove_node(node, allow_graceful=False)
                self.missing_nodes += 1
                return f"removed node {node_id[:8]} holding {actor_name} (to be replaced)"
        ray.kill(ray.get_actor(actor_name, namespace=ray_namespace()), no_restart=False)
        return f"{actor_name} is on the head node: killed its process"

    def _controller_node(self, _rng: random.Random) -> str:
        from actors.controller_directory import ControllerDirectory
        from runtime.names import TopicName

        entry = ControllerDirectory().get(TopicName.parse(self.run.topic))
        return self._kill_node_of(entry.host) if entry is not None else "no controller runs"

    def _segment_node(self, rng: random.Random) -> str:
        from runtime.names import TopicName

        layout = self.admin.get_layout(self.run.topic)
        info = rng.choice(list(layout.active_segments.values()))
        name = TopicName.parse(self.run.topic).segment(
            info.segment_id, info.hash_range.start, info.hash_range.end
        )
        from actors.segment.directory import SegmentDirectory

        entry = SegmentDirectory().get(name)  # the segment's host process
        return self._kill_node_of(entry.host) if entry is not None else f"{name} not served"

    def _coordinator(self, _rng: random.Random) -> str:
        import ray

        from actors.control.coordinator_host import coordinator_actor
        from runtime.names import TopicName

        coordinator = coordinator_actor(TopicName.parse(self.run.topic), "stream")
        ray.kill(coordinator.host, no_restart=False)
        return "killed the topic's coordinator host (the stream subscription's coordinator)"

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


def check(run: Run, admin: Any) -> list[str]:
    """Every invariant the issue lists, as human-readable violations."""
    import ray

    from runtime.names import TopicName
    from tests.chaos.invariants import delivery_violations, segment_state_violations
    from tests.segments import segment_actor

    problems = [
        f"stream: {p}" for p in delivery_violations(run.acked, run.stream, exactly_once=True)
    ]
    # a queue (shared) subscription promises at least once, not per-key order
    queue = delivery_violations(run.acked, run.queue, exactly_once=False, ordered=False)
    problems += [f"queue: {p}" for p in queue]
    layout = admin.get_layout(run.topic)
    try:
        layout.check_invariants()
    except Exception as err:
        problems.append(f"layout: {err}")
    name, states = TopicName.parse(run.topic), {}
    for info in layout.all_segments.values():
        seg = name.segment(info.segment_id, info.hash_range.start, info.hash_range.end)
        stats = ray.get(segment_actor(seg).stats.remote(), timeout=60)
        states[info.segment_id] = (info.state.value, stats["terminated"])
    return problems + segment_state_violations(states)


def drain(run: Run, timeout_s: float) -> None:
    """Let consumers catch up with every acked message (or give up at the timeout)."""
    deadline = time.monotonic() + timeout_s
    want = set(run.acked)
    while time.monotonic() < deadline:
        if want <= set(run.stream) and want <= set(run.queue):
            break
        time.sleep(0.5)
    run.stop_consuming.set()


def start_cluster(nodes: int, head_resources: dict[str, float] | None = None) -> Any:
    """The head (never removed: it holds the GCS) plus ``nodes`` one-CPU workers."""
    from ray.cluster_utils import Cluster

    system = {"health_check_period_ms": 1000, "health_check_failure_threshold": 10}
    head = {"num_cpus": 1, "include_dashboard": False, "_system_config": system}
    cluster = Cluster(initialize_head=True, head_node_args={**head, "resources": head_resources})
    for _ in range(nodes):
        cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    return cluster


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", default=str(random.randrange(1 << 30)), help="e.g. 1-10 or 7")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of load + faults")
    parser.add_argument("--rate", type=float, default=150.0, help="messages per second")
    parser.add_argument("--nodes", type=int, default=3, help="worker nodes beside the head")
    args = parser.parse_args(argv)
    first, _, last = args.seeds.partition("-")
    failed = 0
    with chaos_cluster(args.nodes) as cluster:
        for seed in range(int(first), int(last or first) + 1):
            plan = schedule(seed, args.duration)
            print(f"chaos seed={seed} schedule={json.dumps(plan)}", flush=True)
            result = run_chaos(cluster, seed, plan, args.duration, args.rate)
            print(json.dumps(result), flush=True)
            failed += bool(result["violations"])
    return 1 if failed else 0


@contextlib.contextmanager
def chaos_cluster(nodes: int, head_resources: dict[str, float] | None = None) -> Iterator[Any]:
    """One multi-node cluster for a series of runs (starting one costs tens of seconds)."""
    os.environ.setdefault("RAYTOPICS_STORAGE_ROOT", tempfile.mkdtemp(prefix="raytopics-chaos-"))
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # a killed queue consumer's messages come back after this, not the default 30 s
    os.environ.setdefault("RAYTOPICS_ACK_TIMEOUT_S", "5")
    import ray

    from runtime import connect

    cluster = start_cluster(nodes, head_resources)
    try:
        connect(cluster.address, namespace=f"chaos-{os.getpid()}", log_to_driver=False)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@dataclass
class Workload:
    """A topic under load: its run record, producer and stream-consumer threads, and
    the queue consumer's process."""

    run: Run
    threads: list[threading.Thread]
    queue: QueueConsumerProcess
    started: float


def start_workload(
    cluster: Any, topic: str, rate: float, retention_s: float | None = None
) -> Workload:
    """Create ``topic`` (2 segments, a stream and a queue subscription) and load it.

    ``retention_s`` gives the topic a retention policy: long runs need one, as
    every split and merge leaves sealed segments (and their actors) behind, and
    without pruning the drained ones a soak's node faults restart ever more actors.
    """
    from clients import ScalableTopicsAdmin

    started = time.monotonic()
    admin = ScalableTopicsAdmin(controller_restart_timeout_s=120)
    run = Run(topic)
    admin.create_scalable_topic(run.topic, 2)
    if retention_s is not None:
        admin.set_policy(run.topic, {"retention": {"timeS": retention_s}})
    admin.create_subscription(run.topic, "stream")
    admin.create_subscription(run.topic, "queue")
    queue = QueueConsumerProcess(run, cluster.address)
    queue.start()
    threads = [
        threading.Thread(target=f, args=(run, *a), daemon=True)
        for f, a in ((produce, (rate,)), (consume_stream, ()))
    ]
    for thread in threads:
        thread.start()
    return Workload(run, threads, queue, started)


def finish_workload(workload: Workload) -> dict[str, Any]:
    """Stop producing, let the consumers drain, check every invariant, delete the topic."""
    from clients import ScalableTopicsAdmin

    run, started = workload.run, workload.started
    admin = ScalableTopicsAdmin(controller_restart_timeout_s=120)
    phases = {"load": time.monotonic() - started}
    run.stop_producing.set()
    workload.threads[0].join(timeout=240)
    phases["flush"] = time.monotonic() - started
    drain(run, timeout_s=120)
    workload.threads[1].join(timeout=60)
    workload.queue.finish(timeout_s=60)
    phases["drain"] = time.monotonic() - started
    violations = check(run, admin)
    if len(run.acked) < 0.9 * (len(run.acked) + len(run.errors)):
        violations.append(f"too many failed sends: {run.errors[:5]}")
    phases["check"] = time.monotonic() - started
    admin.delete_scalable_topic(run.topic)
    return {
        "acked": len(run.acked),
        "stream_delivered": len(run.stream),
        "queue_delivered": len(run.queue),
        "faults": run.faults,
        "violations": violations[:20],
        "wall_s": round(time.monotonic() - started, 1),
        "phases_end_s": {k: round(v, 1) for k, v in phases.items()},
    }


def run_chaos(
    cluster: Any,
    seed: int,
    plan: list[tuple[float, str]],
    duration_s: float,
    rate: float,
    retention_s: float | None = None,
) -> dict[str, Any]:
    """One seed's workload and faults on its own topic, then the checks."""
    topic = f"topic://chaos/s{seed}-{os.getpid()}/events"
    workload = start_workload(cluster, topic, rate, retention_s)
    faults = Faults(cluster, workload.run, random.Random(seed), workload.queue)
    t0 = time.monotonic()
    for at, fault in plan:
        faults.wait_until(t0 + at)
        faults.start(fault)
    faults.wait_until(t0 + duration_s)
    faults.join(timeout_s=240)
    return {"seed": seed, **finish_workload(workload)}


if __name__ == "__main__":
    sys.exit(main())
