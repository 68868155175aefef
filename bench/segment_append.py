"""Append throughput of one segment actor, next to Redis Streams and a raw file.

Appends 100-byte records to ONE segment actor at several batch sizes under each
durability policy (pipelined, with a bounded window of appends in flight), XADDs
the same records to a Redis Streams server started by this script (AOF on,
``appendfsync everysec``), and writes them to a plain file with no fsync, which
is the ceiling any disk-backed log on this machine can reach. Each measurement
is capped by time and by a record budget. Everything runs ``--rounds`` times,
interleaved, and each row reports its median round: CPU steal on a shared VM
moves any one measurement by tens of percent.

    .venv/bin/python bench/segment_append.py            # everything, 3 rounds, ~14 minutes
    .venv/bin/python bench/segment_append.py --rounds 1 --seconds 1 --batch-sizes 1 1000

Prints a table and writes ``bench/results/segment_append.json``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from _common import machine_info, redis_server, report, write_report

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

RECORD_BYTES = 100
POLICIES = ("fsync", "interval", "none")
BATCH_SIZES = (1, 100, 1_000, 10_000)
DEFAULT_RESULTS = REPO / "bench" / "results" / "segment_append.json"
_WARM_BLOCK = 1 << 20
# Linux free page reporting on this VM: how much freed memory went back to the host.
_REPORTED_KIB = Path("/sys/module/page_reporting/parameters/reported_kib")
_REPORTER_QUIET_S = 2.2  # longer than the ~1.8 s from a free to the pass that reports it
_REPORTER_WAIT_S = 20.0


@dataclass
class Measurement:
    system: str  # "segment" (Ray calls), "segment-tcp" (data plane), "redis" or "file"
    policy: str  # durability policy; "everysec" for Redis, "no-fsync" for the file
    batch_size: int
    batches: int
    records: int
    seconds: float

    @property
    def msgs_per_s(self) -> float:
        return self.records / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.records * RECORD_BYTES / self.seconds / 1e6

    @property
    def label(self) -> str:
        return f"{self.system}/{self.policy}"


def make_values(count: int) -> list[bytes]:
    """Distinct, incompressible 100-byte records (a counter prefix plus random bytes)."""
    noise = os.urandom(RECORD_BYTES * count)
    return [
        (b"%010d" % i) + noise[i * RECORD_BYTES + 10 : (i + 1) * RECORD_BYTES] for i in range(count)
    ]


def timed_loop(
    step: Callable[[], int], batch_size: int, seconds: float, record_budget: int
) -> tuple[int, float]:
    """Run ``step`` (one batch, returns batches completed) until time or budget runs out."""
    batches = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds and batches * batch_size < record_budget:
        batches += step()
    return batches, time.perf_counter() - started


# --- the raw file ceiling -------------------------------------------------------------


def bench_file(
    directory: Path, values: list[bytes], batch_size: int, seconds: float, budget: int
) -> Measurement:
    """One ``write`` per batch of the concatenated records, never flushed: the ceiling."""
    path = directory / f"raw-{batch_size}.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o644)
    chunk = values[:batch_size]

    def step() -> int:
        os.write(fd, b"".join(chunk))
        return 1

    try:
        batches, elapsed = timed_loop(step, batch_size, seconds, budget)
    finally:
        os.close(fd)
        path.unlink()
    return Measurement("file", "no-fsync", batch_size, batches, batches * batch_size, elapsed)


def warm_page_cache(directory: Path, args: argparse.Namespace) -> None:
    """Write and delete as many bytes as a measurement may write, so that its page
    cache comes from memory the machine has just used.

    On a VM that hands free memory back to its host (Linux free page reporting, as
    on this Firecracker VM), the first write into memory that was handed back costs
    a host fault per page: ``perf`` put 78% of a segment's CPU in the kernel's copy
    into the page cache, and 100 KB writes ran at 0.3 GB/s instead of 4 GB/s. Which
    rows met such memory depended on what ran before them (the raw file, first in
    each round, seldom did). Freed pages are reused first, so every row starts
    like the others, unless the host takes them back first (it took ~600 MB within
    a second of a 1 GB delete). ``--no-warm`` measures without it."""
    if args.no_warm:
        return
    wait_for_page_reporter()
    path = directory / "warm.bin"
    block = bytes(_WARM_BLOCK)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(args.budget * RECORD_BYTES // _WARM_BLOCK):
            os.write(fd, block)
    finally:
        os.close(fd)
        path.unlink()


def wait_for_page_reporter() -> None:
    """Wait until the VM's free page reporting has handed back what was freed before
    (the last measurement's files, say), so that its next pass does not come in the
    middle of this one and take the memory just warmed.

    Measured here: the reporter's pass came ~1.8 s after 1 GB was deleted and
    reported ~450 MB of it, the next pass ~2 s later. Warmed at once after the
    previous measurement was deleted, 7 rounds in 27 at batch 1,000 ran cold (the
    segment's system time 60-150 us per batch instead of ~40); waiting first, 1 in
    14 did. A machine without the reporter does not wait."""
    if not _REPORTED_KIB.exists():
        return
    started = quiet_since = time.monotonic()
    last = _REPORTED_KIB.read_text()
    while time.monotonic() - quiet_since < _REPORTER_QUIET_S:
        if time.monotonic() - started > _REPORTER_WAIT_S:
            return  # a busy reporter is noise to report, not a reason to hang
        time.sleep(0.05)
        now = _REPORTED_KIB.read_text()
        if now != last:
            last, quiet_since = now, time.monotonic()


# --- Redis Streams ------------------------------------------------------------------------


def bench_redis(
    client: object, values: list[bytes], batch_size: int, seconds: float, budget: int
) -> Measurement:
    """XADD every record; one non-transactional pipeline ``execute`` per batch."""
    stream = f"bench-{batch_size}"
    chunk = values[:batch_size]

    def step() -> int:
        pipe = client.pipeline(transaction=False)
        for value in chunk:
            pipe.xadd(stream, {"v": value})
        pipe.execute()
        return 1

    try:
        batches, elapsed = timed_loop(step, batch_size, seconds, budget)
    finally:
        client.delete(stream)
    return Measurement("redis", "everysec", batch_size, batches, batches * batch_size, elapsed)


# --- the segment actor ----------------------------------------------------------------------


def bench_segment(
    handle: object,
    policy: str,
    values: list[bytes],
    batch_size: int,
    seconds: float,
    budget: int,
    window: int,
) -> Measurement:
    """Sequenced appends from one producer, at most ``window`` in flight.

    The batch is built once: building it is the producer's cost, not the segment's.
    """
    import ray

    from runtime.batch import make_batch

    batch = make_batch(values[:batch_size])
    producer = f"bench-{batch_size}"
    in_flight: list[object] = []
    sequence = 0
    ray.get(handle.append.remote(batch, producer, sequence))  # warm up the call path
    sequence += 1

    def step() -> int:
        nonlocal sequence
        in_flight.append(handle.append.remote(batch, producer, sequence))
        sequence += 1
        if len(in_flight) < window:
            return 0
        ray.get(in_flight.pop(0))
        return 1

    started = time.perf_counter()
    batches, _ = timed_loop(step, batch_size, seconds, budget)
    ray.get(in_flight)
    batches += len(in_flight)
    elapsed = time.perf_counter() - started
    return Measurement("segment", policy, batch_size, batches, batches * batch_size, elapsed)


def bench_segment_tcp(
    handle: object,
    policy: str,
    values: list[bytes],
    batch_size: int,
    seconds: float,
    budget: int,
    window: int,
) -> Measurement:
    """The same appends over the segment's TCP data plane (what producers use)."""
    import asyncio

    from clients._data_plane import SegmentChannel
    from runtime.batch import make_batch, serialize_batch

    payload = serialize_batch(make_batch(values[:batch_size]))
    producer = f"bench-tcp-{batch_size}"

    async def run() -> tuple[int, float]:
        channel = SegmentChannel(handle)
        await channel.append(producer, 0, payload)  # connect and warm up
        sequence, batches, in_flight = 1, 0, collections.deque()
        started = time.perf_counter()
        while time.perf_counter() - started < seconds and batches * batch_size < budget:
            while len(in_flight) < window:
                in_flight.append(asyncio.ensure_future(channel.append(producer, sequence, payload)))
                sequence += 1
            # Answers come in order on one connection: the oldest append completes first.
            # (``asyncio.wait`` over the whole window costs O(window) per answer.)
            await in_flight.popleft()
            batches += 1
        await asyncio.gather(*in_flight)
        elapsed = time.perf_counter() - started
        await channel.close()
        return batches + len(in_flight), elapsed

    batches, elapsed = asyncio.run(run())
    return Measurement("segment-tcp", policy, batch_size, batches, batches * batch_size, elapsed)


def connect_ray(root: Path, args: argparse.Namespace) -> None:
    from runtime import connect

    os.environ["RAYTOPICS_STORAGE_ROOT"] = str(root / "segments")
    os.environ.setdefault("RAYTOPICS_NAMESPACE", f"bench-{uuid.uuid4().hex[:8]}")
    extra = {}
    if args.ray_inline_bytes:
        extra["_system_config"] = {"max_direct_call_object_size": args.ray_inline_bytes}
    connect(num_cpus=2, include_dashboard=False, log_to_driver=False, **extra)


def run_segments(
    root: Path, values: list[bytes], args: argparse.Namespace, round_: int
) -> Iterator[Measurement]:
    import ray

    from actors.segment.host import start_segment_actor
    from runtime.names import TopicName
    from storage.durability import Durability

    for policy in args.policies:
        for batch_size in args.batch_sizes:
            for index, measure in enumerate((bench_segment, bench_segment_tcp)):
                # A fresh segment per measurement: each starts from an empty log and a
                # fresh actor (the TCP rows ran 20-30% slower on the actor the Ray-call
                # rows had just filled), and files (and their cleanup) stay small.
                topic = TopicName("bench", "append", f"{policy}-{batch_size}-{round_}")
                handle = start_segment_actor(
                    topic.segment(index, 0, 0xFFFF),
                    initialize=True,
                    storage_root=str(root / "segments"),
                    durability=Durability(policy=policy),  # type: ignore[arg-type]
                )
                ray.get(handle.ready.remote())
                try:
                    warm_page_cache(root, args)
                    yield measure(
                        handle, policy, values, batch_size, args.seconds, args.budget, args.window
                    )
                    ray.get(handle.delete.remote())
                finally:
                    ray.kill(handle.host, no_restart=True)


def run_round(
    root: Path, values: list[bytes], args: argparse.Namespace, redis: object, round_: int
) -> Iterator[Measurement]:
    """Every system once, in the same order each round."""
    for batch_size in args.batch_sizes:
        warm_page_cache(root, args)
        yield bench_file(root, values, batch_size, args.seconds, args.budget)
    if redis is not None:
        for batch_size in args.batch_sizes:
            warm_page_cache(root, args)
            yield bench_redis(redis.client, values, batch_size, args.seconds, args.budget)
    yield from run_segments(root, values, args, round_)


def medians(rounds: list[list[Measurement]]) -> tuple[list[Measurement], dict[str, list[int]]]:
    """Per (system, policy, batch size): the round with the median rate, and every
    round's rate. A shared 2-core VM's speed drifts by tens of percent within
    minutes (CPU steal); a median of interleaved rounds compares like with like."""
    by_label: dict[tuple[str, str, int], list[Measurement]] = {}
    for measurements in rounds:
        for m in measurements:
            by_label.setdefault((m.system, m.policy, m.batch_size), []).append(m)
    chosen, rates = [], {}
    for (system, policy, batch_size), runs in by_label.items():
        ordered = sorted(runs, key=lambda m: m.msgs_per_s)
        chosen.append(ordered[(len(ordered) - 1) // 2])
        rates[f"{system}/{policy}/{batch_size}"] = [round(m.msgs_per_s) for m in runs]
    return chosen, rates


# --- reporting ----------------------------------------------------------------------------------


def table(results: list[Measurement]) -> list[dict[str, object]]:
    rows = []
    for m in results:
        redis = next(
            (r for r in results if r.system == "redis" and r.batch_size == m.batch_size), None
        )
        file = next(
            (r for r in results if r.system == "file" and r.batch_size == m.batch_size), None
        )
        rows.append(
            {
                **asdict(m),
                "msgs_per_s": round(m.msgs_per_s),
                "mb_per_s": round(m.mb_per_s, 2),
                "vs_redis": round(m.msgs_per_s / redis.msgs_per_s, 3) if redis else None,
                "vs_file": round(m.msgs_per_s / file.msgs_per_s, 4) if file else None,
            }
        )
    order = {"segment": 0, "segment-tcp": 1, "redis": 2, "file": 3}
    rows.sort(
        key=lambda r: (
            r["batch_size"],
            order[r["system"]],
            POLICIES.index(r["policy"]) if r["policy"] in POLICIES else 0,
        )
    )
    return rows


def print_table(rows: list[dict[str, object]]) -> None:
    header = f"{'batch':>6}  {'system/policy':<18} {'msgs/s':>12} {'MB/s':>9} "
    header += f"{'vs Redis':>9} {'vs file':>8}"
    print(header)
    print("-" * len(header))
    for r in rows:
        vs_redis = f"{r['vs_redis']:.2f}x" if r["vs_redis"] is not None else "-"
        vs_file = f"{r['vs_file']:.3f}x" if r["vs_file"] is not None else "-"
        print(
            f"{r['batch_size']:>6}  {r['system'] + '/' + r['policy']:<18} "
            f"{r['msgs_per_s']:>12,} {r['mb_per_s']:>9.1f} {vs_redis:>9} {vs_file:>8}"
        )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="time cap per measurement")
    parser.add_argument("--budget", type=int, default=10_000_000, help="record cap per measurement")
    parser.add_argument("--window", type=int, default=64, help="appends in flight")
    parser.add_argument(
        "--rounds", type=int, default=3, help="runs of everything; each row reports the median"
    )
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=list(BATCH_SIZES))
    parser.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES))
    parser.add_argument("--skip-redis", action="store_true")
    parser.add_argument(
        "--no-warm",
        action="store_true",
        help="measure without first writing and deleting a measurement's worth of bytes",
    )
    parser.add_argument(
        "--ray-inline-bytes",
        type=int,
        default=0,
        help="experiment: Ray's max_direct_call_object_size (0 keeps Ray's default, 100 KiB)",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS)
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    info = machine_info()
    values = make_values(max(args.batch_sizes))
    rounds: list[list[Measurement]] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="segment-append-bench-") as tmp:
        root = Path(tmp)
        with contextlib.ExitStack() as stack:
            redis = None
            if not args.skip_redis:
                try:
                    redis = stack.enter_context(redis_server(root))
                    info["redis_server"] = redis.version
                except FileNotFoundError as exc:
                    print(f"skipping Redis: {exc}")
            connect_ray(root, args)
            stack.callback(_shutdown_ray)
            for round_ in range(args.rounds):
                rounds.append([])
                for m in run_round(root, values, args, redis, round_):
                    rounds[-1].append(m)
                    print(
                        f"round {round_ + 1}  {m.label:<20} batch {m.batch_size:>6}: "
                        f"{m.msgs_per_s:>12,.0f} msgs/s"
                    )
    info["load_average_at_end"] = os.getloadavg()
    chosen, rates = medians(rounds)
    rows = table(chosen)
    print()
    print_table(rows)
    results_file = report(
        "segment_append",
        started,
        info,
        settings={
            "record_bytes": RECORD_BYTES,
            "seconds_per_measurement": args.seconds,
            "record_budget_per_measurement": args.budget,
            "rounds": args.rounds,
            "window": args.window,
            "ray_max_direct_call_object_size": args.ray_inline_bytes or "default",
            "redis": "appendonly yes, appendfsync everysec; redis-py pipeline per batch",
            "file": "one os.write per batch, no fsync",
            "segment": "one actor per measurement, sequenced appends from one producer",
            "warm_page_cache": not args.no_warm,
            "reported": "per row, the round with the median rate; every round's rate below",
        },
        results=rows,
        rounds_msgs_per_s=rates,
    )
    write_report(args.out, results_file)
    return 0


def _shutdown_ray() -> None:
    import ray

    ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
