"""What the end-to-end benchmark's systems share: the workload (stamped 100-byte
values over 10,000 keys), paced sends, latency logs, CPU meters and the measurement
record, so that Scalable Topics and its peers (Redis Streams, NATS JetStream) are
measured alike."""

from __future__ import annotations

import argparse
import multiprocessing
import operator
import os
import struct
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

RECORD_BYTES = 100
KEYS = 10_000
SUBSCRIPTION = "bench"
LATENCY_SAMPLE_CAP = 2_000_000  # per consumer; later messages are counted, not timed


# --- the workload, identical for every system ----------------------------------------


class Workload:
    """Pre-built values and keys, so producing costs only the timestamp stamp."""

    def __init__(self, batch: int, seed: int = 0, values: str = "random") -> None:
        rng = np.random.default_rng(seed)
        self.batch = batch
        # Record i: 8-byte send stamp (filled per batch), 8-byte counter, 84 random bytes
        # (``values="json"``: 84 bytes of an event in JSON, one of 40 users', as event
        # streams repeat themselves).
        self.template = rng.integers(0, 256, size=(batch, RECORD_BYTES), dtype=np.uint8)
        if values == "json":
            events = np.frombuffer(b"".join(_json_event(i) for i in range(40)), np.uint8)
            self.template[:, 16:] = events.reshape(40, RECORD_BYTES - 16)[np.arange(batch) % 40]
        self.template[:, 8:16] = np.arange(batch, dtype="<u8").view(np.uint8).reshape(batch, 8)
        self.offsets = np.arange(0, (batch + 1) * RECORD_BYTES, RECORD_BYTES, dtype=np.int32)
        self.key_names = [f"key-{i:05d}" for i in range(KEYS)]
        # A pool of key indices; batch k uses a rotating window of it.
        self.key_pool = rng.integers(0, KEYS, size=batch * 16 + batch)
        self.pool_starts = [i * batch for i in range(16)]

    def keys_index(self, k: int) -> np.ndarray:
        start = self.pool_starts[k % len(self.pool_starts)]
        return self.key_pool[start : start + self.batch]

    def stamped(self, count: int) -> tuple[np.ndarray, int]:
        """A fresh copy of ``count`` records with the send time in their first 8 bytes."""
        records = self.template[:count].copy()
        stamp = time.time_ns()
        records[:, :8] = np.frombuffer(struct.pack("<q", stamp), dtype=np.uint8)
        return records, stamp


def _json_event(user: int) -> bytes:
    text = f'{{"user":"user-{user:04d}","event":"page_view","page":"/p/{user % 7}"}}'
    return text.encode().ljust(RECORD_BYTES - 16, b" ")


_STAMP = operator.itemgetter(slice(0, 8))
VALUE_OF = operator.attrgetter("value")  # a received message's value


def stamps_of(values: Iterable[bytes]) -> np.ndarray:
    return np.frombuffer(b"".join(map(_STAMP, values)), dtype="<i8")


def value_stamps(values: Any) -> np.ndarray:
    """The send stamps of an Arrow binary array of values, read off its buffers."""
    offsets = np.frombuffer(values.buffers()[1], dtype=np.int32)
    starts = offsets[values.offset : values.offset + len(values)]
    data = np.frombuffer(values.buffers()[2], dtype=np.uint8)
    return data[starts[:, None] + np.arange(8)].view("<i8").ravel()


def summarize_latency(latencies_ns: np.ndarray) -> dict[str, float | None]:
    if not len(latencies_ns):
        return {"p50_ms": None, "p99_ms": None, "max_ms": None, "samples": 0}
    p50, p99 = np.percentile(latencies_ns, [50, 99])
    return {
        "p50_ms": round(float(p50) / 1e6, 2),
        "p99_ms": round(float(p99) / 1e6, 2),
        "max_ms": round(float(latencies_ns.max()) / 1e6, 2),
        "samples": int(len(latencies_ns)),
    }


class LatencyLog:
    """Latencies of received messages, kept as arrays (subsampled past a cap).

    Messages stamped before ``measure_from_ns`` (a warm-up) are counted in
    ``received`` but timed apart, in ``warmup``."""

    def __init__(self, measure_from_ns: int = 0) -> None:
        self.measure_from_ns = measure_from_ns
        self.parts: list[np.ndarray] = []
        self.warmup: list[np.ndarray] = []
        self.stored: list[np.ndarray] = []  # sampled: (publish - send, receive - publish)
        self.count = 0
        self.received = 0
        self.measured = 0
        self.first_ns = 0
        self.last_ns = 0
        self.lock = threading.Lock()

    def add(
        self,
        stamps: np.ndarray,
        now_ns: int,
        sampled: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        """``sampled``: (send stamps, store times in ns) of a few of the messages, which
        split the latency at the moment the log stored them (ms precision)."""
        with self.lock:
            self.received += len(stamps)
            if len(stamps) and stamps.min() < self.measure_from_ns:
                warm = stamps < self.measure_from_ns
                self.warmup.append(now_ns - stamps[warm])
                stamps, sampled = stamps[~warm], None
                if not len(stamps):
                    return
            if not self.measured:
                self.first_ns = now_ns
            self.measured += len(stamps)
            self.last_ns = now_ns
            if self.count < LATENCY_SAMPLE_CAP:
                self.parts.append(now_ns - stamps)
                self.count += len(stamps)
                if sampled is not None:
                    sent, stored = sampled
                    self.stored.append(np.stack([stored - sent, now_ns - stored]))

    def snapshot(self, with_latencies: bool) -> dict[str, Any]:
        with self.lock:
            out: dict[str, Any] = {
                "received": self.received,
                "measured": self.measured,
                "first_ns": self.first_ns,
                "last_ns": self.last_ns,
            }
            if with_latencies:
                out["latencies"] = (
                    np.concatenate(self.parts) if self.parts else np.zeros(0, np.int64)
                )
                out["split"] = (
                    np.concatenate(self.stored, axis=1) if self.stored else np.zeros((2, 0))
                )
                out["warmup"] = (
                    np.concatenate(self.warmup) if self.warmup else np.zeros(0, np.int64)
                )
            return out


def sample_rows(count: int, samples: int = 16) -> range:
    return range(0, count, max(1, count // samples))


class PacedSends:
    """``(k, stamped records)`` of each send of a producer, and their accounting. It
    starts at ``go_at_ns``; a paced run first warms up at its rate until
    ``measure_from_ns`` (every warm-up stamp is earlier, which is how consumers tell
    them apart), counted in ``warmup`` instead of ``sent``."""

    def __init__(self, spec: dict[str, Any], workload: Workload) -> None:
        self.spec, self.workload = spec, workload
        self.sent, self.warmup, self.started_ns = 0, 0, 0

    def __iter__(self) -> Iterator[tuple[int, np.ndarray]]:
        spec, workload, measure_from = self.spec, self.workload, self.spec["measure_from_ns"]
        time.sleep(max(0.0, (spec["go_at_ns"] - time.time_ns()) / 1e9))
        if spec.get("rate") and measure_from > time.time_ns():
            warm = {**spec, "messages": 1 << 62, "seconds": (measure_from - time.time_ns()) / 1e9}
            for k, count in send_ticks(warm, workload.batch):
                records, stamp = workload.stamped(count)
                if stamp >= measure_from:
                    break
                self.warmup += count
                yield k, records
            time.sleep(max(0.0, (measure_from - time.time_ns()) / 1e9))
        self.started_ns = time.time_ns()
        for k, count in send_ticks(spec, workload.batch):
            self.sent += count
            yield k, workload.stamped(count)[0]

    def report(self, end_ns: int, cpu_s: float) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "warmup": self.warmup,
            "start_ns": self.started_ns,
            "end_ns": end_ns,
            "cpu_s": cpu_s,
        }


def send_ticks(spec: dict[str, Any], batch: int) -> Iterator[tuple[int, int]]:
    """``(k, count)`` of each send of a producer: ``count`` messages due now (paced at
    the spec's rate, if any, in ticks of ``tick_records``), until its caps are reached."""
    limit, seconds, rate = spec["messages"], spec["seconds"], spec.get("rate")
    tick = min(spec["tick_records"], batch) if rate else batch
    started, sent, k = time.perf_counter(), 0, 0
    while sent < limit and time.perf_counter() - started < seconds:
        delay = started + sent / rate - time.perf_counter() if rate else 0
        if delay > 0:
            time.sleep(delay)
        count = min(tick, limit - sent)
        yield k, count
        sent += count
        k += 1


class CpuMeter:
    """CPU seconds used by a set of process trees (utime + stime from /proc), so a
    measurement can report CPU per message, which is far steadier than wall-clock
    rates when the machine is shared, and which process spent it."""

    TICK = os.sysconf("SC_CLK_TCK")

    def __init__(self, roots: list[int]) -> None:
        self.roots = roots
        self.start = self._sample()

    def _sample(self) -> dict[int, tuple[str, float]]:
        children: dict[int, list[int]] = {}
        stats: dict[int, float] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                raw = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = raw[raw.rfind(")") + 2 :].split()
            children.setdefault(int(fields[1]), []).append(int(entry))
            stats[int(entry)] = (int(fields[11]) + int(fields[12])) / self.TICK
        seen: dict[int, tuple[str, float]] = {}
        stack = list(self.roots)
        while stack:
            pid = stack.pop()
            if pid in seen or pid not in stats:
                continue
            seen[pid] = (_process_label(pid), stats[pid])
            stack.extend(children.get(pid, []))
        return seen

    def used(self) -> tuple[float, dict[str, float]]:
        """CPU seconds since construction, in total and per kind of process
        (processes that exited meanwhile are missed)."""
        by_label: dict[str, float] = {}
        for pid, (label, cpu) in self._sample().items():
            spent = cpu - self.start.get(pid, (label, 0.0))[1]
            if spent > 0:
                by_label[label] = by_label.get(label, 0.0) + spent
        return sum(by_label.values()), dict(sorted(by_label.items(), key=lambda kv: -kv[1]))


def _process_label(pid: int) -> str:
    """``ray::SegmentHost``, ``raylet``, ``redis-server``... (method names dropped)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        first = argv[0].decode(errors="replace").strip()
        if not first:  # exiting, or a fork without a command line of its own
            return Path(f"/proc/{pid}/comm").read_text().strip() or "?"
    except OSError:
        return "?"
    if first.startswith("ray::"):
        return first.split(".")[0].split()[0]
    if len(argv) > 1 and first.endswith(("python", "python3", "python3.11")):
        script = next((a.decode() for a in argv[1:] if a and not a.startswith(b"-")), "")
        return "python " + Path(script).name
    return Path(first.split()[0]).name


def producer_spec(
    args: argparse.Namespace, rate: float | None, seconds: float
) -> tuple[int, dict[str, Any]]:
    """How many producers a run uses and what each is told: a paced (half-load) run
    has one producer; a peak run splits the message cap over ``--producers``."""
    producers = 1 if rate else args.producers
    go_at = time.time_ns() + int(1.5e9)  # everyone starts at once, after setting up
    return producers, {
        "go_at_ns": go_at,
        "measure_from_ns": go_at + (int(args.warmup_seconds * 1e9) if rate else 0),
        "batch": args.batch,
        "messages": args.messages // producers if not rate else 1 << 62,
        "seconds": seconds,
        "rate": rate / producers if rate else None,
        "tick_records": max(1, int((rate or 0) / producers * args.tick_ms / 1000)),
        "values": args.values,
    }


def wait_until(predicate: Any, timeout_s: float, every_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(every_s)
    return True


def measurement(
    system: str,
    n: int,
    sent_reports: list[dict[str, Any]],
    consumer_reports: list[dict[str, Any]],
    drained: bool,
    rate: float | None,
    cpu_s: float,
    cpu_breakdown: dict[str, float],
) -> dict[str, Any]:
    sent = sum(r["sent"] for r in sent_reports)
    start_ns = min(r["start_ns"] for r in sent_reports)
    produced_ns = max(r["end_ns"] for r in sent_reports)
    received = sum(r["measured"] for r in consumer_reports)
    received_all = sum(r["received"] for r in consumer_reports)  # with the warm-up's
    last_ns = max((r["last_ns"] for r in consumer_reports if r["measured"]), default=start_ns)
    latencies = np.concatenate([r["latencies"] for r in consumer_reports])
    split = np.concatenate([r["split"] for r in consumer_reports], axis=1)
    return {
        "system": system,
        "segments": n,
        "security": "off",
        "mode": "half_load" if rate else "peak",
        "target_rate": round(rate) if rate else None,
        "sent": sent,
        "received": received,
        "all_received": drained,
        "failed_batches": sum(r.get("failed_batches", 0) for r in sent_reports),
        "produce_s": round((produced_ns - start_ns) / 1e9, 3),
        "e2e_s": round((last_ns - start_ns) / 1e9, 3),
        "produce_msgs_per_s": round(sent / ((produced_ns - start_ns) / 1e9)),
        "e2e_msgs_per_s": round(min(sent, received) / max((last_ns - start_ns) / 1e9, 1e-9)),
        "latency": summarize_latency(latencies),
        "latency_send_to_stored": summarize_latency(split[0]),
        "latency_stored_to_received": summarize_latency(split[1]),
        "warmup_sent": sum(r["warmup"] for r in sent_reports),
        "warmup_latency": summarize_latency(
            np.concatenate([r["warmup"] for r in consumer_reports])
        ),
        "cpu_s": round(cpu_s, 2),  # the warm-up's too, so per message over every message
        "cpu_us_per_msg": round(cpu_s / max(received_all, 1) * 1e6, 2),
        "cpu_us_per_msg_by_process": {
            label: round(spent / max(received_all, 1) * 1e6, 2)
            for label, spent in cpu_breakdown.items()
            if spent / max(received_all, 1) * 1e6 >= 0.01
        },
        "producer_process_cpu_us_per_msg": round(
            sum(r["cpu_s"] for r in sent_reports) / max(received_all, 1) * 1e6, 2
        ),
        "load_average_after": round(os.getloadavg()[0], 1),
    }


# --- a peer's run: producers and consumers in processes of their own ----------------------


def run_peer_case(
    system: str,
    server_pid: int,
    n: int,
    args: argparse.Namespace,
    rate: float | None,
    seconds: float,
    produce: Callable[..., dict[str, Any]],
    consume: Callable[..., dict[str, Any]],
) -> dict[str, Any]:
    """One measurement of a peer: ``produce(n, spec)`` in each producer process and
    ``consume(n, name, spec, stop, received)`` in each consumer process return their
    reports; the CPU is theirs plus the server's (``server_pid``'s tree)."""
    ctx = multiprocessing.get_context("fork")  # before Ray starts: no threads to worry about
    producers, spec = producer_spec(args, rate, seconds)
    stop, received = ctx.Event(), ctx.Value("q", 0)
    results, consumed = ctx.Queue(), ctx.Queue()
    consumers = [
        ctx.Process(target=_child, args=(consumed, consume, n, f"c{i}", spec, stop, received))
        for i in range(args.consumers)
    ]
    workers = [
        ctx.Process(target=_child, args=(results, produce, n, {**spec, "seed": i}))
        for i in range(producers)
    ]
    for p in consumers + workers:
        p.start()
    time.sleep(max(0.0, (spec["go_at_ns"] - time.time_ns()) / 1e9))
    meter = CpuMeter([server_pid])
    sent_reports = [_reported(results) for _ in workers]
    sent = sum(r["sent"] + r["warmup"] for r in sent_reports)
    drained = wait_until(lambda: received.value >= sent, args.drain_seconds)
    stop.set()
    server_cpu, breakdown = meter.used()
    reports = [_reported(consumed) for _ in consumers]
    for p in consumers + workers:
        p.join(timeout=10)
    cpu = server_cpu + sum(r["cpu_s"] for r in sent_reports + reports)
    breakdown["producers"] = sum(r["cpu_s"] for r in sent_reports)
    breakdown["consumers"] = sum(r["cpu_s"] for r in reports)
    return measurement(system, n, sent_reports, reports, drained, rate, cpu, breakdown)


def _child(out: Any, run: Callable[..., dict[str, Any]], *run_args: Any) -> None:
    """In a child process: put what ``run`` returns on ``out``, or the error it raised,
    since the runner waits on ``out`` and must not wait forever for a failed child."""
    try:
        out.put(run(*run_args))
    except BaseException:
        out.put({"error": traceback.format_exc()})
        raise


def _reported(out: Any) -> dict[str, Any]:
    found = out.get()
    if "error" in found:
        raise RuntimeError(f"a peer's bench process failed:\n{found['error']}")
    return found
