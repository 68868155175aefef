"""The chaos runs' workload: a topic of two segments with a stream and a queue
subscription, keyed producers sending ``key:seq`` (each key's sequence its producer's),
a stream consumer that never crashes (checked exactly once, per-key order), and a queue
consumer in a process of its own (checked at least once), which the faults may kill.
``finish_workload`` stops producing, lets the consumers drain and checks every
invariant (``tests.chaos.invariants``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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
    # producer threads that counted their acks (appended to: the threads end together)
    producers_done: list[int | None] = field(default_factory=list)
    # What the stream consumer's readers held when the drain gave up: where to look.
    stuck: dict[str, Any] = field(default_factory=dict)
    stream_consumer: Any = None


def _decode(value: bytes) -> tuple[str, int]:
    key, seq = value.decode().split(":")
    return key, int(seq)


def produce(run: Run, rate: float, producer_index: int | None = None) -> None:
    """Keyed sends at ``rate`` until told to stop; with ``producer_index``, keys of this
    producer's own (several producers, each key's order its producer's)."""
    from clients import Producer

    prefix = "k" if producer_index is None else f"p{producer_index}k"
    seqs = dict.fromkeys((f"{prefix}{i}" for i in range(KEYS)), 0)
    pending: list[tuple[Any, tuple[str, int]]] = []
    with Producer(run.topic, send_timeout_s=120) as producer:
        i = 0
        while not run.stop_producing.is_set():
            key = f"{prefix}{i % KEYS}"
            pending.append(
                (producer.send(f"{key}:{seqs[key]}".encode(), key=key), (key, seqs[key]))
            )
            seqs[key] += 1
            i += 1
            time.sleep(1 / rate)
        producer.flush(timeout_s=180)
        # Every outcome looked at before the producer closes: a failure nobody looked at
        # makes the close raise, which would end this thread before its acks are counted.
        for future, message in pending:
            try:
                future.result(timeout=0)
                run.acked.append(message)
            except Exception as err:  # not acked: allowed to be lost, but must be rare
                run.errors.append(f"send {message} failed: {type(err).__name__}")
    run.producers_done.append(producer_index)


def consume_stream(run: Run) -> None:
    from clients import StreamConsumer

    consumer = run.stream_consumer = StreamConsumer(run.topic, "stream", "c1")
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
        # A process's own stop event: one killed while it held the event's lock (in
        # ``is_set``) would leave a shared one locked for good, and ``finish`` waiting on it.
        self.stop: Any = None
        self.process: Any = None
        self.recorders: list[threading.Thread] = []
        self.lock = threading.Lock()

    def start(self) -> None:
        import ray

        receive, send = self.context.Pipe(duplex=False)
        self.stop = self.context.Event()
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
    else:
        if not want <= set(run.stream):
            run.stuck = stream_diagnosis(run)
    run.stop_consuming.set()


def stream_diagnosis(run: Run) -> dict[str, Any]:
    """The stream consumer's readers (what it fetched, delivered, had acknowledged) and
    the stream subscription's cursor and each segment's state, as the cluster says."""
    from clients import ScalableTopicsAdmin

    readers = {}
    consumer = run.stream_consumer
    if consumer is not None:
        for sid, reader in list(consumer._core.readers.items()):
            readers[sid] = {
                "position": reader.position, "delivered": reader.delivered,
                "acked": reader.acked, "flushed": reader.flushed, "end": reader.end,
                "revoked": reader.revoked, "done": reader.task is not None and reader.task.done(),
            }  # fmt: skip
    try:
        stats = ScalableTopicsAdmin().get_stats(run.topic)
        segments = {
            sid: {k: v for k, v in seg.items() if k != "subscriptions"}
            | {"stream": (seg.get("subscriptions") or {}).get("stream")}
            for sid, seg in stats.get("segments", {}).items()
        }
        assignment = stats["subscriptions"]["stream"].get("assignments")
    except Exception as err:  # noqa: BLE001 - a diagnosis must not fail the report
        segments, assignment = {"error": repr(err)}, None
    return {"readers": readers, "segments": segments, "assignments": assignment}


def one_cpu() -> dict[str, Any]:
    return {"num_cpus": 1}


@dataclass
class Shape:
    """What a run's cluster and topic are: the workers' start arguments (also of a node
    added in place of a removed one), its namespace's policy, its producers."""

    node_args: Callable[[], dict[str, Any]] = one_cpu
    policy: dict[str, Any] | None = None
    producers: int = 1


@dataclass
class Workload:
    """A topic under load: its run record, producer and stream-consumer threads, and
    the queue consumer's process."""

    run: Run
    producers: list[threading.Thread]
    consumer: threading.Thread
    queue: QueueConsumerProcess
    started: float


def start_workload(
    cluster: Any,
    topic: str,
    rate: float,
    retention_s: float | None = None,
    shape: Shape | None = None,
) -> Workload:
    """Create ``topic`` (2 segments, a stream and a queue subscription) and load it.

    ``retention_s`` gives the topic a retention policy: long runs need one, as
    every split and merge leaves sealed segments (and their actors) behind, and
    without pruning the drained ones a soak's node faults restart ever more actors.
    ``shape``: its namespace's policy and how many producers (one by default).
    """
    from clients import ScalableTopicsAdmin
    from runtime.names import TopicName

    shape = shape or Shape()
    started = time.monotonic()
    admin = ScalableTopicsAdmin(controller_restart_timeout_s=120)
    run = Run(topic)
    if shape.policy:
        admin.set_namespace_policy(TopicName.parse(topic).namespace_path, shape.policy)
    admin.create_scalable_topic(run.topic, 2)
    if retention_s is not None:
        admin.set_policy(run.topic, {"retention": {"timeS": retention_s}})
    admin.create_subscription(run.topic, "stream")
    admin.create_subscription(run.topic, "queue")
    queue = QueueConsumerProcess(run, cluster.address)
    queue.start()
    if shape.producers == 1:
        work = [(rate, None)]
    else:
        work = [(rate / shape.producers, i) for i in range(shape.producers)]
    producers = [threading.Thread(target=produce, args=(run, *a), daemon=True) for a in work]
    consumer = threading.Thread(target=consume_stream, args=(run,), daemon=True)
    for thread in (*producers, consumer):
        thread.start()
    return Workload(run, producers, consumer, queue, started)


def finish_workload(workload: Workload) -> dict[str, Any]:
    """Stop producing, let the consumers drain, check every invariant, delete the topic."""
    from clients import ScalableTopicsAdmin

    run, started = workload.run, workload.started
    admin = ScalableTopicsAdmin(controller_restart_timeout_s=120)
    phases = {"load": time.monotonic() - started}
    run.stop_producing.set()
    for producer in workload.producers:
        producer.join(timeout=240)
    phases["flush"] = time.monotonic() - started
    drain(run, timeout_s=120)
    workload.consumer.join(timeout=60)
    workload.queue.finish(timeout_s=60)
    phases["drain"] = time.monotonic() - started
    violations = check(run, admin)
    if len(run.producers_done) != len(workload.producers):
        failed = len(workload.producers) - len(run.producers_done)
        violations.append(f"{failed} producer thread(s) ended before counting their acks")
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
        **({"stuck": run.stuck} if run.stuck else {}),
        "wall_s": round(time.monotonic() - started, 1),
        "phases_end_s": {k: round(v, 1) for k, v in phases.items()},
    }
