"""End to end: produce and consume 100-byte messages through 1, 4 and 8 segments.

For each segment count, on the public client API (``Producer.send_batch`` and
``StreamConsumer`` in their own processes, acknowledging everything):

* **peak**: producers push messages as fast as they can (keys spread over
  10,000 keys) while consumers receive and acknowledge them. Reported: produce
  rate (until every send is acknowledged by its segment), end-to-end rate
  (until the last message is received) and produce-to-receive latency, taken
  from a ``time.time_ns()`` stamp that the producer writes into the first 8
  bytes of every value just before ``send_batch`` (one clock, one machine).
* **half load**: one producer paced at 50% of the end-to-end peak for
  ``--half-seconds``, sending a batch every ``--tick-ms``; latency p50/p99.
  It first sends at the same rate for ``--warmup-seconds`` (1 s): those
  messages are received and acknowledged like the rest but left out of the
  rates and percentiles (reported on their own as ``warmup_latency``), as
  OpenMessaging Benchmark's warm-up phase does. Without it the first ~0.3 s,
  while the processes go from idle to busy, carried most of the 1% tail.

The same workload goes through Redis Streams (a redis-server this script
starts, AOF ``everysec``): XADD in one redis-py pipeline per batch, one stream
per "segment" (the key's Murmur3 hash picks the stream exactly as it picks our
segment) and a consumer group read with XREADGROUP (COUNT = batch) + XACK; and
through NATS JetStream (a nats-server this script starts, file storage): a stream
per "segment", every message published with an acknowledgement, a durable pull
consumer per stream (``bench/e2e_redis.py``, ``bench/e2e_nats.py``).

``--security`` runs our measurements once per mode, so that one run compares
them on the same machine in the same state: ``off``; ``auth``, a policy stored
in the cluster and clients presenting a token (every connection's HELLO and
every Ray call checked); ``tls``, the data plane over TLS with certificates
made for the run; ``auth+tls``, both; ``remote``, producers and consumers outside Ray:
programs that never import Ray and produce and consume through the REST gateway
(``Producer(url=...)``, ``StreamConsumer(url=...)``, ``bench/e2e_remote_producer.py`` and
``bench/e2e_remote_consumer.py``), the records over the data plane. The table then
says what each costs against ``off`` (rates and CPU per message).

    .venv/bin/python bench/end_to_end.py                 # everything, ~4-6 minutes
    .venv/bin/python bench/end_to_end.py --segments 4 --seconds 5 --skip-redis --skip-nats
    .venv/bin/python bench/end_to_end.py --segments 1 8 --skip-redis --security off auth tls
    .venv/bin/python bench/end_to_end.py --segments 4 --skip-redis --skip-nats --security off remote

Prints a table and writes ``bench/results/end_to_end.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from _common import machine_info, nats_server, redis_server, report, write_report
from e2e_common import (
    KEYS,
    RECORD_BYTES,
    SUBSCRIPTION,
    VALUE_OF,
    CpuMeter,
    LatencyLog,
    PacedSends,
    Workload,
    measurement,
    producer_spec,
    sample_rows,
    stamps_of,
    value_stamps,
    wait_until,
)
from e2e_nats import run_nats_case
from e2e_redis import run_redis_case

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

if TYPE_CHECKING:
    from runtime.auth import AuthPolicy

DEFAULT_RESULTS = REPO / "bench" / "results" / "end_to_end.json"
SYSTEM_NAMES = {"ray": "scalable-topics", "redis": "redis-streams", "nats": "nats-jetstream"}
# A policy change reaches every actor within the guard's refresh interval (1 s).
AUTH_SETTLE_S = 1.5


# --- security modes -----------------------------------------------------------------------

SECURITY_MODES = ("off", "auth", "tls", "auth+tls")
# Variants measured the same way: producers compressing appends (no security), and
# producers outside Ray, through the REST gateway.
COMPRESSION_MODES = ("zstd", "lz4")
REMOTE_MODE = "remote"
MODES = SECURITY_MODES + COMPRESSION_MODES + (REMOTE_MODE,)
REMOTE_PRODUCER = REPO / "bench" / "e2e_remote_producer.py"
REMOTE_CONSUMER = REPO / "bench" / "e2e_remote_consumer.py"
TOPIC_NAMESPACE = "bench/e2e"


@dataclass(frozen=True)
class ClientSecurity:
    """What the bench's clients need in a mode. They run in Ray workers (producer tasks,
    consumer actors), which do not inherit the driver's environment, so it travels in
    their arguments: the token to present, and the CA to verify segments against."""

    mode: str = "off"
    token: str | None = None
    ca: str | None = None
    compression: str | None = None
    url: str | None = None  # producers and consumers outside Ray, through this gateway

    def client_config(self) -> dict[str, Any]:
        """Keyword arguments for ``Producer`` / ``StreamConsumer``."""
        return {"token": self.token} if self.token is not None else {}

    def producer_config(self) -> dict[str, Any]:
        """Keyword arguments for ``Producer`` alone."""
        config: dict[str, Any] = {"compression": self.compression} if self.compression else {}
        return config | self.gateway()

    def gateway(self) -> dict[str, Any]:
        """``url=`` for a client outside Ray, nothing for a Ray driver's."""
        return {"url": self.url} if self.url else {}


def apply_client_tls(ca: str | None) -> None:
    """Make this process's clients verify segments against ``ca``, or speak plaintext
    without one: a Ray worker may run a client of one mode after one of another."""
    from runtime.tls import CA_ENV

    if ca:
        os.environ[CA_ENV] = ca
    else:
        os.environ.pop(CA_ENV, None)


def bench_policy(operator_token: str, client_token: str) -> AuthPolicy:
    """An operator allowed everything, and an application that may produce and consume
    the bench's namespace only: what a deployment would hand its clients."""
    from runtime.auth import AuthPolicy

    grants = {
        "operator": (operator_token, "*", ["admin"]),
        "bench-app": (client_token, TOPIC_NAMESPACE, ["produce", "consume"]),
    }
    return AuthPolicy.from_config(
        {
            "tokens": [
                {
                    "principal": principal,
                    "token": token,
                    "grants": [{"namespace": namespace, "actions": actions}],
                }
                for principal, (token, namespace, actions) in grants.items()
            ]
        }
    )


@contextlib.contextmanager
def security(mode: str, root: Path) -> Iterator[ClientSecurity]:
    """The cluster and this driver set up for ``mode`` while the block runs.

    Auth: the policy goes into the catalog (the actors apply it within a second or
    so, hence the pause) and the driver's admin calls present the operator token.
    TLS: the driver's ``RAYTOPICS_TLS_*`` settings name fresh certificates, so the
    topics created meanwhile start segments that speak TLS."""
    auth, encrypted = mode in ("auth", "auth+tls"), mode in ("tls", "auth+tls")
    with contextlib.ExitStack() as stack:
        token = stack.enter_context(_auth_on()) if auth else None
        ca = stack.enter_context(_tls_on(root)) if encrypted else None
        compression = mode if mode in COMPRESSION_MODES else None
        url = stack.enter_context(_gateway()) if mode == REMOTE_MODE else None
        yield ClientSecurity(mode=mode, token=token, ca=ca, compression=compression, url=url)


@contextlib.contextmanager
def _gateway() -> Iterator[str]:
    """The REST gateway, serving while the block runs; yields its URL."""
    from _common import free_port

    from actors.gateway.server import start_gateway, stop_gateway

    port = free_port()
    url = start_gateway(port)
    try:
        yield url
    finally:
        stop_gateway(port)


@contextlib.contextmanager
def _auth_on() -> Iterator[str]:
    """A policy in the cluster while the block runs; yields the clients' token."""
    from runtime.auth import TOKEN_ENV
    from storage.catalog import Catalog

    operator, client = (f"bench-{who}-{uuid.uuid4().hex}" for who in ("operator", "app"))
    previous = os.environ.get(TOKEN_ENV)
    Catalog().replace_auth(bench_policy(operator, client))
    os.environ[TOKEN_ENV] = operator
    time.sleep(AUTH_SETTLE_S)
    try:
        yield client
    finally:
        Catalog().disable_auth()
        _restore(TOKEN_ENV, previous)
        time.sleep(AUTH_SETTLE_S)


@contextlib.contextmanager
def _tls_on(root: Path) -> Iterator[str]:
    """The driver's TLS settings name certificates for this node while the block runs;
    yields the CA clients verify against."""
    import ray
    from _pki import make_pki

    from runtime.tls import CA_ENV, CERT_ENV, KEY_ENV

    directory = Path(tempfile.mkdtemp(prefix="pki-", dir=root))  # fresh names per mode
    files = make_pki(directory, (ray.util.get_node_ip_address(), "127.0.0.1"))
    settings = {CERT_ENV: files.cert, KEY_ENV: files.key, CA_ENV: files.ca}
    previous = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        yield files.ca
    finally:
        for name, value in previous.items():
            _restore(name, value)


def _restore(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


# --- Scalable Topics on Ray --------------------------------------------------------------


def ray_producer(topic: str, spec: dict[str, Any]) -> dict[str, Any]:
    """Push messages with ``send_batch`` (at full speed, or paced at ``spec['rate']``)."""
    import pyarrow as pa

    from clients import Producer

    workload = Workload(spec["batch"], seed=spec["seed"], values=spec["values"])
    keys = pa.array(workload.key_names, type=pa.string())
    key_batches = [keys.take(pa.array(workload.keys_index(k))) for k in range(16)]
    offsets = pa.py_buffer(workload.offsets)
    futures = []
    client: ClientSecurity = spec["client"]
    apply_client_tls(client.ca)
    options = spec["producer_config"] | client.client_config() | client.producer_config()
    with Producer(topic, **options) as producer:
        # Warm the path (connection, segment handles) outside the measurement.
        warm, _ = workload.stamped(1)
        producer.send_batch([warm.tobytes()], keys=["key-00000"]).result()
        cpu = time.process_time()
        sends = PacedSends(spec, workload)
        for k, records in sends:
            count = len(records)
            values = pa.Array.from_buffers(
                pa.binary(), count, [None, offsets, pa.py_buffer(records)]
            )
            batch_keys = key_batches[k % 16]
            futures.append(producer.send_batch(values, batch_keys.slice(0, count)))
        producer.flush()
        end_ns = time.time_ns()
    cpu = time.process_time() - cpu  # the whole process: the driver's too in thread mode
    report = sends.report(end_ns, cpu)
    report["warmup"] += 1  # and the message that opened the path
    report["failed_batches"] = sum(1 for f in futures if f.exception() is not None)
    return report


class ConsumerBench:
    """A StreamConsumer in its own process (a Ray actor, or a program outside Ray in the
    ``remote`` mode): receives, stamps latency, acks everything."""

    def __init__(
        self,
        topic: str,
        name: str,
        batch: int,
        columnar: bool,
        config: dict[str, Any],
        client: ClientSecurity,
    ) -> None:
        from clients import StreamConsumer

        apply_client_tls(client.ca)
        config = {**config, **client.client_config(), **client.gateway()}
        self.consumer = StreamConsumer(topic, SUBSCRIPTION, name, **config)
        self.batch = batch
        self.receive = self._receive_table if columnar else self._receive_messages
        self.log = LatencyLog()
        self.stopped = False
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stopped:
            if (received := self.receive()) is not None:
                self.log.add(*received)

    def _receive_table(self) -> tuple[np.ndarray, int, tuple[np.ndarray, np.ndarray]] | None:
        from runtime.batch import int64_values

        table = self.consumer.receive_table(self.batch, timeout=0.1)
        if not table.num_rows:
            return None
        now = time.time_ns()
        self.consumer.acknowledge_cumulative(table)
        stamps = np.concatenate([value_stamps(c) for c in table.column("value").chunks])
        publish = table.column("publish_time").chunks
        stored = np.concatenate([int64_values(c) for c in publish]) * 1_000_000
        rows = np.asarray(sample_rows(len(stamps)))
        return stamps, now, (stamps[rows], stored[rows])

    def _receive_messages(
        self,
    ) -> tuple[np.ndarray, int, tuple[np.ndarray, np.ndarray]] | None:
        messages = self.consumer.receive_batch(self.batch, timeout=0.1)
        if not messages:
            return None
        now = time.time_ns()
        self.consumer.acknowledge_cumulative(messages)
        rows = sample_rows(len(messages))
        stored = np.array(
            [round(messages[i].publish_time.timestamp() * 1e3) * 1_000_000 for i in rows]
        )
        sent = stamps_of([messages[i].value for i in rows])
        return stamps_of(map(VALUE_OF, messages)), now, (sent, stored)

    def assigned(self) -> list[int]:
        return self.consumer.assigned_segments()

    def received(self) -> int:
        return self.log.received

    def reset(self, measure_from_ns: int) -> None:
        self.log = LatencyLog(measure_from_ns)

    def report(self) -> dict[str, Any]:
        return self.log.snapshot(with_latencies=True)

    def close(self) -> None:
        self.stopped = True
        self.thread.join(timeout=5)
        self.consumer.close()


def make_consumer_class() -> Any:
    import ray

    return ray.remote(num_cpus=0, max_concurrency=4)(ConsumerBench)


class ConsumerProgram:
    """``ConsumerBench`` in a program outside Ray (``bench/e2e_remote_consumer.py``), a
    child of this driver so that ``CpuMeter`` counts it: each method call is a JSON line
    to it, and its answer one back."""

    def __init__(self, topic: str, name: str, *spec: Any) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
        self.program = subprocess.Popen(
            [sys.executable, str(REMOTE_CONSUMER)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True, bufsize=1,
        )  # fmt: skip
        first = [topic, name, *spec[:-1], dataclasses.asdict(spec[-1])]
        self.ask("start", *first)

    def ask(self, method: str, *args: Any) -> Any:
        self.program.stdin.write(json.dumps({"call": method, "args": args}) + "\n")
        line = self.program.stdout.readline()
        if not line:
            raise RuntimeError(f"the remote consumer exited ({self.program.wait()}): its stderr")
        answer = json.loads(line)
        if answer.get("ray_imported"):
            raise RuntimeError("the remote consumer imported Ray")
        found = answer["answer"]
        if isinstance(found, dict):
            found = {key: _from_program(value) for key, value in found.items()}
        return found

    def close(self) -> None:
        self.ask("close")
        self.program.stdin.close()
        self.program.wait(timeout=30)


def _from_program(value: Any) -> Any:
    """An array a consumer program saved for its answer, read back (and its file gone)."""
    if not (isinstance(value, dict) and set(value) == {"npy"}):
        return value
    path = Path(value["npy"])
    try:
        return np.load(path)
    finally:
        path.unlink(missing_ok=True)


def ask(consumers: list[Any], method: str, *args: Any) -> list[Any]:
    """Each consumer's ``method``: an actor's through Ray, a program's over its pipes."""
    if consumers and isinstance(consumers[0], ConsumerProgram):
        return [consumer.ask(method, *args) for consumer in consumers]
    import ray

    return ray.get([getattr(consumer, method).remote(*args) for consumer in consumers])


def run_ray_case(
    topic: str,
    n: int,
    consumers: list[Any],
    args: argparse.Namespace,
    rate: float | None,
    seconds: float,
    client: ClientSecurity,
) -> dict[str, Any]:
    import ray

    producers, spec = producer_spec(args, rate, seconds)
    spec["client"] = client
    ask(consumers, "reset", spec["measure_from_ns"])
    spec["producer_config"] = {"batch_max_records": max(args.batch, 5_000)}
    if args.linger_ms is not None:
        spec["producer_config"]["linger_ms"] = args.linger_ms

    def start_meter() -> CpuMeter:
        time.sleep(max(0.0, (spec["go_at_ns"] - time.time_ns()) / 1e9))
        return CpuMeter([os.getpid()])  # the driver's tree: Ray itself and every actor

    if client.url is not None:
        programs = [remote_producer(topic, {**spec, "seed": i}) for i in range(producers)]
        meter = start_meter()
        sent_reports = [remote_report(program) for program in programs]
    elif args.producer_mode == "task":
        remote = ray_producer_task()
        refs = [remote.remote(topic, {**spec, "seed": i}) for i in range(producers)]
        meter = start_meter()
        sent_reports = ray.get(refs)
    else:
        sent_reports = [None] * producers

        def run(i: int) -> None:
            sent_reports[i] = ray_producer(topic, {**spec, "seed": i})

        threads = [threading.Thread(target=run, args=(i,)) for i in range(producers)]
        for t in threads:
            t.start()
        meter = start_meter()
        for t in threads:
            t.join()
    sent = sum(r["sent"] + r["warmup"] for r in sent_reports)
    drained = wait_until(
        lambda: sum(ask(consumers, "received")) >= sent,
        args.drain_seconds,
    )
    cpu, breakdown = meter.used()
    if client.url is not None:  # the programs exited before the meter's sample: their own
        outside = sum(r["cpu_s"] for r in sent_reports)
        cpu, breakdown = cpu + outside, breakdown | {"producer outside Ray": outside}
    reports = ask(consumers, "report")
    found = measurement("ray", n, sent_reports, reports, drained, rate, cpu, breakdown)
    return {**found, "security": client.mode}


def run_ray_cases(
    admin: Any,
    n: int,
    args: argparse.Namespace,
    client: ClientSecurity,
    half_rate: float | None = None,
) -> list[dict[str, Any]]:
    """The peak run of ``n`` segments, then the half-load run at ``half_rate`` (default
    ``--half-rate``, else half this peak's end-to-end rate)."""
    # A fresh topic per measurement: a peak run may leave a backlog behind.
    with ray_topic(admin, n, args, client) as (topic, consumers):
        peak = run_ray_case(topic, n, consumers, args, None, args.seconds, client)
        stored = admin.get_stats(topic)["sizeBytes"]
        peak["stored_bytes_per_msg"] = round(stored / max(peak["sent"] + peak["warmup_sent"], 1), 1)
    print(describe(peak), flush=True)
    if args.skip_half:
        return [peak]
    rate = half_rate or args.half_rate or peak["e2e_msgs_per_s"] / 2
    with ray_topic(admin, n, args, client) as (topic, consumers):
        half = run_ray_case(topic, n, consumers, args, rate, args.half_seconds, client)
    print(describe(half), flush=True)
    return [peak, half]


def run_security_modes(
    admin_class: Any, n: int, args: argparse.Namespace, root: Path
) -> list[dict[str, Any]]:
    """Every ``--security`` mode at ``n`` segments, side by side so that they see the
    machine alike. Their half-load runs share off's rate (when off is measured), so
    their latencies compare at one load. The admin client is made inside each mode:
    it presents the mode's operator token."""
    results: list[dict[str, Any]] = []
    half_rate = None
    for mode in args.security:
        with security(mode, root) as client:
            found = run_ray_cases(admin_class(), n, args, client, half_rate)
        if mode == "off" and len(found) > 1:
            half_rate = found[1]["target_rate"]
        results += found
    return results


def warm_up_ray(admin: Any, args: argparse.Namespace) -> None:
    """One short peak run left out of the results: the first measurement of a run
    otherwise pays for starting Ray's workers, which would make whichever mode
    comes first look dearer than it is."""
    n = args.segments[0]
    short = argparse.Namespace(**{**vars(args), "seconds": min(args.seconds, 2.0)})
    with ray_topic(admin, n, short, ClientSecurity()) as (topic, consumers):
        run_ray_case(topic, n, consumers, short, None, short.seconds, ClientSecurity())


def remote_producer(topic: str, spec: dict[str, Any]) -> subprocess.Popen:
    """``ray_producer`` in a program outside Ray (``bench/e2e_remote_producer.py``), a
    child of this driver, so that ``CpuMeter`` counts it with the rest."""
    spec = {**spec, "client": dataclasses.asdict(spec["client"])}
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    program = subprocess.Popen(
        [sys.executable, str(REMOTE_PRODUCER), topic],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True,
    )  # fmt: skip
    program.stdin.write(json.dumps(spec))
    program.stdin.close()
    return program


def remote_report(program: subprocess.Popen) -> dict[str, Any]:
    out = program.stdout.read()  # its spec was written whole at its start
    if program.wait(timeout=60) != 0:
        raise RuntimeError(f"the remote producer failed ({program.returncode}); see its stderr")
    report = json.loads(out.splitlines()[-1])
    if report.pop("ray_imported"):
        raise RuntimeError("the remote producer imported Ray")
    return report


_PRODUCER_TASK = None


def ray_producer_task() -> Any:
    global _PRODUCER_TASK
    if _PRODUCER_TASK is None:
        import ray

        _PRODUCER_TASK = ray.remote(num_cpus=0, max_retries=0)(ray_producer)
    return _PRODUCER_TASK


@contextlib.contextmanager
def ray_topic(
    admin: Any, n: int, args: argparse.Namespace, client: ClientSecurity
) -> Iterator[tuple[str, list[Any]]]:
    """A fresh topic of ``n`` segments, its subscription and consumers ready on every segment."""
    import ray

    topic = f"topic://{TOPIC_NAMESPACE}/s{n}-{uuid.uuid4().hex[:6]}"
    admin.create_scalable_topic(topic, n)
    admin.create_subscription(topic, SUBSCRIPTION)
    config = {"read_batch": args.read_batch} if args.read_batch else {}
    spec = (args.batch, args.consume == "table", config, client)
    if client.url is not None:
        consumers: list[Any] = [
            ConsumerProgram(topic, f"c{i}", *spec) for i in range(args.consumers)
        ]
    else:
        consumer_class = make_consumer_class()
        consumers = [consumer_class.remote(topic, f"c{i}", *spec) for i in range(args.consumers)]
    try:
        if not wait_until(lambda: sum(map(len, ask(consumers, "assigned"))) >= n, 30):
            raise RuntimeError(f"consumers of {topic} were not assigned all {n} segments in 30 s")
        yield topic, consumers
    finally:
        if client.url is not None:
            for c in consumers:
                c.close()
        else:
            ray.get([c.close.remote() for c in consumers])
            for c in consumers:
                ray.kill(c)
        admin.delete_scalable_topic(topic)


def describe(m: dict[str, Any]) -> str:
    lat = m["latency"]
    stored, delivered = m["latency_send_to_stored"], m["latency_stored_to_received"]
    return (
        f"{m['system']:<6} {m['segments']:>2} seg {m['security']:<8} {m['mode']:<9} "
        f"sent {m['sent']:>9,} "
        f"recv {m['received']:>9,}  produce {m['produce_msgs_per_s']:>10,}/s  "
        f"e2e {m['e2e_msgs_per_s']:>10,}/s  p50 {lat['p50_ms']} ms  p99 {lat['p99_ms']} ms  "
        f"cpu {m['cpu_us_per_msg']} us/msg  load {m['load_average_after']}"
        + ("" if m["all_received"] else "  (NOT all received in time)")
        + "\n         cpu us/msg by process: "
        + ", ".join(f"{k} {v}" for k, v in list(m["cpu_us_per_msg_by_process"].items())[:6])
        + f"; producer process {m['producer_process_cpu_us_per_msg']}"
        + f"\n         p50/p99 ms send->stored {stored['p50_ms']}/{stored['p99_ms']}, "
        + f"stored->received {delivered['p50_ms']}/{delivered['p99_ms']}"
        + (
            f"; warm-up ({m['warmup_sent']:,} msgs) p50/p99 {warm['p50_ms']}/{warm['p99_ms']} ms"
            if (warm := m["warmup_latency"])["samples"] > 1
            else ""
        )
    )


def rows_of(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per system, segment count and security mode: its peak, its half load, and
    how it compares with Redis and with the same segment count without security."""
    found = {(m["system"], m["segments"], m["security"], m["mode"]): m for m in results}
    rows = []
    for system, n, mode, kind in sorted(found, key=_row_order):
        if kind != "peak":
            continue
        peak, half = found[system, n, mode, "peak"], found.get((system, n, mode, "half_load"))
        redis, off = found.get(("redis", n, "off", "peak")), found.get((system, n, "off", "peak"))
        nats = found.get(("nats", n, "off", "peak"))
        rows.append(
            {
                "system": SYSTEM_NAMES[system],
                "segments": n,
                "security": mode,
                "produce_msgs_per_s": peak["produce_msgs_per_s"],
                "e2e_msgs_per_s": peak["e2e_msgs_per_s"],
                "p50_ms": peak["latency"]["p50_ms"],
                "p99_ms": peak["latency"]["p99_ms"],
                "half_load_rate": half["target_rate"] if half else None,
                "half_p50_ms": half["latency"]["p50_ms"] if half else None,
                "half_p99_ms": half["latency"]["p99_ms"] if half else None,
                "cpu_us_per_msg": peak["cpu_us_per_msg"],
                "stored_bytes_per_msg": peak.get("stored_bytes_per_msg"),
                "e2e_vs_redis": _ratio(peak, redis, "e2e_msgs_per_s") if system == "ray" else None,
                "e2e_vs_nats": _ratio(peak, nats, "e2e_msgs_per_s") if system == "ray" else None,
                "cpu_vs_nats": _ratio(peak, nats, "cpu_us_per_msg") if system == "ray" else None,
                **_against_off(peak, off if mode != "off" else None),
            }
        )
    return rows


def _row_order(key: tuple[str, int, str, str]) -> tuple[int, int, int, str]:
    system, n, mode, kind = key
    return (list(SYSTEM_NAMES).index(system), n, MODES.index(mode), kind)


def _against_off(peak: dict[str, Any], off: dict[str, Any] | None) -> dict[str, float | None]:
    """A secured run's figures over the same run without security."""
    return {
        f"{name}_vs_off": _ratio(peak, off, field)
        for name, field in (
            ("e2e", "e2e_msgs_per_s"),
            ("produce", "produce_msgs_per_s"),
            ("cpu", "cpu_us_per_msg"),
            ("stored", "stored_bytes_per_msg"),
        )
    }


def _ratio(m: dict[str, Any], base: dict[str, Any] | None, field: str) -> float | None:
    """``m``'s figure over ``base``'s (None without a base to compare with)."""
    if base is None or not base[field]:
        return None
    return round(m[field] / base[field], 3)


def print_table(rows: list[dict[str, Any]]) -> None:
    header = (
        f"{'system':<16} {'seg':>3} {'security':<8} {'produce/s':>11} {'e2e/s':>11}"
        f" {'p50 ms':>8} {'p99 ms':>8} {'half rate':>10} {'½ p50':>7} {'½ p99':>7}"
        f" {'CPU us/msg':>10} {'vs Redis':>8} {'vs NATS':>7}"
        f" {'e2e/off':>7} {'CPU/off':>7} {'disk/off':>8}"
    )
    print(header)
    print("-" * len(header))

    def num(x: Any, fmt: str, suffix: str = "") -> str:
        return "-" if x is None else format(x, fmt) + suffix

    for r in rows:
        print(
            f"{r['system']:<16} {r['segments']:>3} {r['security']:<8}"
            f" {r['produce_msgs_per_s']:>11,} {r['e2e_msgs_per_s']:>11,}"
            f" {num(r['p50_ms'], '.1f'):>8} {num(r['p99_ms'], '.1f'):>8}"
            f" {num(r['half_load_rate'], ','):>10} {num(r['half_p50_ms'], '.1f'):>7}"
            f" {num(r['half_p99_ms'], '.1f'):>7} {num(r['cpu_us_per_msg'], '.2f'):>10}"
            f" {num(r['e2e_vs_redis'], '.2f', 'x'):>8} {num(r['e2e_vs_nats'], '.2f', 'x'):>7}"
            f" {num(r['e2e_vs_off'], '.2f', 'x'):>7}"
            f" {num(r['cpu_vs_off'], '.2f', 'x'):>7} {num(r['stored_vs_off'], '.2f', 'x'):>8}"
        )


def targets(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ours = [r for r in rows if r["system"] == "scalable-topics" and r["security"] == "off"]
    goals: dict[str, Any] = {}
    if ours:
        best_produce = max(r["produce_msgs_per_s"] for r in ours)
        ratios = [r["e2e_vs_redis"] for r in ours if r["e2e_vs_redis"] is not None]
        half_p99 = [r["half_p99_ms"] for r in ours if r["half_p99_ms"] is not None]
        goals |= {
            "produce_1M_msgs_per_s": {"best": best_produce, "met": best_produce >= 1_000_000},
            "e2e_at_least_redis": {
                "ratios": ratios,
                "met": bool(ratios) and min(ratios) >= 1.0,
            },
            "half_load_p99_le_50ms": {
                "p99_ms": half_p99,
                "met": bool(half_p99) and max(half_p99) <= 50,
            },
        }
    auth = [r for r in rows if r["security"] == "auth" and r["e2e_vs_off"] is not None]
    if auth:
        costs = {r["segments"]: _cost(r) for r in auth}
        goals["auth_costs_le_10pct"] = {
            "cost_by_segments": costs,
            "met": max(max(c.values()) for c in costs.values()) <= 0.10,
        }
    return goals


def _cost(row: dict[str, Any]) -> dict[str, float]:
    """What a mode costs against off: rate lost (e2e, produce) and CPU per message added."""
    return {
        "e2e_rate": round(1 - row["e2e_vs_off"], 3),
        "produce_rate": round(1 - row["produce_vs_off"], 3),
        "cpu_per_msg": round(row["cpu_vs_off"] - 1, 3),
    }


def peer_runs(
    label: str,
    server: Any,
    run_case: Any,
    root: Path,
    args: argparse.Namespace,
    info: dict[str, Any],
) -> list[dict[str, Any]]:
    """A peer's peak and half-load runs at every segment count, on a server it starts
    (``server(root)``); none, with a message, when the server is not installed."""
    found: list[dict[str, Any]] = []
    try:
        with server(root) as running:
            info[f"{label.lower()}_server"] = running.version
            for n in args.segments:
                peak = run_case(running, n, args, None, args.seconds)
                found.append(peak)
                print(describe(peak), flush=True)
                if not args.skip_half:
                    rate = args.half_rate or peak["e2e_msgs_per_s"] / 2
                    found.append(half := run_case(running, n, args, rate, args.half_seconds))
                    print(describe(half), flush=True)
    except FileNotFoundError as exc:
        print(f"skipping {label}: {exc}")
    return found


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--segments", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--messages", type=int, default=2_000_000, help="cap per peak run")
    parser.add_argument("--seconds", type=float, default=6.0, help="time cap per peak run")
    parser.add_argument("--half-seconds", type=float, default=10.0, help="half-load run length")
    parser.add_argument("--drain-seconds", type=float, default=15.0, help="cap on draining")
    parser.add_argument(
        "--batch", type=int, default=5_000, help="records per send_batch / pipeline"
    )
    parser.add_argument(
        "--half-rate", type=float, default=0, help="half-load rate (0: half the e2e peak)"
    )
    parser.add_argument("--tick-ms", type=float, default=10.0, help="half-load send interval")
    parser.add_argument(
        "--warmup-seconds",
        type=float,
        default=1.0,
        help="half load: send at the rate this long first, outside the figures",
    )
    parser.add_argument(
        "--linger-ms", type=float, default=None, help="producer linger (default: the client's)"
    )
    parser.add_argument("--producers", type=int, default=1)
    parser.add_argument("--consumers", type=int, default=1)
    parser.add_argument("--producer-mode", choices=("task", "thread"), default="task")
    parser.add_argument(
        "--read-batch", type=int, default=0, help="consumer read_batch (0: default)"
    )
    parser.add_argument(
        "--consume",
        choices=("table", "messages"),
        default="table",
        help="our consumer's path: receive_table (columnar) or receive_batch (Message objects)",
    )
    parser.add_argument(
        "--security",
        nargs="+",
        choices=MODES,
        default=["off"],
        help="run our measurements in each of these modes (off first, to compare against); "
        "zstd and lz4: producers compress their appends, without security",
    )
    parser.add_argument(
        "--values",
        choices=("random", "json"),
        default="random",
        help="84 random bytes per value, or repetitive JSON events (what compression is for)",
    )
    parser.add_argument("--skip-redis", action="store_true")
    parser.add_argument("--skip-nats", action="store_true")
    parser.add_argument("--skip-half", action="store_true")
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS)
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    info = machine_info()
    results: list[dict[str, Any]] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="end-to-end-bench-") as tmp:
        root = Path(tmp)
        # The peers first, before Ray starts: they get the quiet machine.
        if not args.skip_redis:
            results += peer_runs("Redis", redis_server, run_redis_case, root, args, info)
        if not args.skip_nats:
            results += peer_runs("NATS", nats_server, run_nats_case, root, args, info)
        from clients import ScalableTopicsAdmin
        from runtime import connect, disconnect

        os.environ["RAYTOPICS_STORAGE_ROOT"] = str(root / "segments")
        # Admission's CPU share per segment (16 per CPU) is not what is measured here:
        # 64 segments on this 2-CPU Ray.
        os.environ.setdefault("RAYTOPICS_SEGMENTS_PER_CPU", str(max(16, max(args.segments))))
        os.environ.setdefault("RAYTOPICS_NAMESPACE", f"bench-{uuid.uuid4().hex[:8]}")
        connect(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            if len(args.security) > 1:
                warm_up_ray(ScalableTopicsAdmin(), args)
            for n in args.segments:
                results += run_security_modes(ScalableTopicsAdmin, n, args, root)
        finally:
            disconnect()  # while the storage root, which holds the embedded Ray's lock, exists
    info["load_average_at_end"] = os.getloadavg()
    rows = rows_of(results)
    print()
    print_table(rows)
    goals = targets(rows)
    for name, goal in goals.items():
        print(f"target {name}: {'met' if goal['met'] else 'NOT met'} ({goal})")
    results_file = report(
        "end_to_end",
        started,
        info,
        settings={
            "record_bytes": RECORD_BYTES,
            "keys": KEYS,
            "segments": args.segments,
            "security": args.security,
            "values": args.values,
            "security_modes": "auth: a policy in the catalog, clients present a token "
            "(produce+consume on the bench's namespace), the driver an operator token; "
            "tls: the data plane over TLS (P-256 certificates made for the run, clients "
            "verify against the run's CA)",
            "batch": args.batch,
            "messages_cap": args.messages,
            "seconds_cap": args.seconds,
            "half_load_seconds": args.half_seconds,
            "half_load_tick_ms": args.tick_ms,
            "producers": args.producers,
            "consumers": args.consumers,
            "producer_mode": args.producer_mode,
            "consumer_read_batch": args.read_batch or "default",
            "consumer_path": "receive_table + acknowledge_cumulative(table)"
            if args.consume == "table"
            else "receive_batch (Message objects) + acknowledge_cumulative(messages)",
            "ray": "embedded, num_cpus=2, durability default (interval 200 ms)",
            "nats": "nats-server with JetStream, file storage (the server's default "
            "sync_interval: writes reach the OS at once, fsync within 2 min); a stream per "
            "segment, "
            "subjects carry the key; publish with an acknowledgement per message, a batch "
            "in flight at a time; a durable pull consumer per stream, AckPolicy.ALL, "
            "the last message of each fetch acknowledged",
            "redis": "appendonly yes, appendfsync everysec; XADD pipeline per batch, "
            "XREADGROUP COUNT=batch + XACK; producers and consumers in processes",
            "latency": "receive time minus the time.time_ns() stamp written into each value "
            "just before send_batch / the pipeline",
        },
        results=results,
        table=rows,
        targets=goals,
    )
    write_report(args.out, results_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
