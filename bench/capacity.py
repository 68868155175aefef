"""Capacity: the largest topic admission allows on this machine, and one beyond it.

On an embedded Ray of its own (a temporary storage root): how many segments
fit (``runtime.capacity`` over Ray's free memory), how fast a topic one
segment larger is refused and whether the machine's memory moves, then the
largest topic that fits: how long its create takes, what the machine's memory
is once its segment processes run, and whether a producer and a consumer on
it still deliver every message.

    .venv/bin/python bench/capacity.py [--messages 20000]

Writes ``bench/results/capacity.json``.

``--fill``: with the default settings, creates topics over REST until admission
refuses one, then, 60 s after the last create, measures what a full machine still
serves: the cores the cluster's processes keep busy and the load average against
the cores, the acknowledgement time of a
producer's sends on a topic created before, and how long ``get_stats`` takes.
Writes ``bench/results/capacity_fill.json`` (or ``--out``); ``tests/test_admission``
runs it and holds it to generous bounds.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import shutil
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RESULTS = Path(__file__).resolve().parent / "results" / "capacity.json"
FILL_RESULTS = RESULTS.with_name("capacity_fill.json")
GIB = 1 << 30


def used_gib() -> float:
    memory = psutil.virtual_memory()
    return round((memory.total - memory.available) / GIB, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--fill", action="store_true", help="fill over REST, then measure")
    parser.add_argument("--segments-per-topic", type=int, default=4)
    parser.add_argument("--settle-s", type=float, default=60.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="capacity-bench-")
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    os.environ["RAYTOPICS_STORAGE_ROOT"] = root
    os.environ["RAYTOPICS_NAMESPACE"] = f"capacity-{uuid.uuid4().hex[:6]}"
    from runtime import connect

    connect("local", include_dashboard=False, log_to_driver=False)
    if args.fill:
        result = fill(args.segments_per_topic, args.settle_s)
        print(json.dumps(result, indent=2))
        (args.out or FILL_RESULTS).write_text(json.dumps(result, indent=2) + "\n")
        return
    from actors.capacity import node_rooms
    from clients import Producer, ScalableTopicsAdmin, StreamConsumer
    from runtime.capacity import SegmentFootprint
    from runtime.errors import InsufficientCapacityError
    from runtime.names import TopicName

    admin = ScalableTopicsAdmin()
    topic = "topic://capacity/bench/largest"
    footprint = SegmentFootprint.from_env()
    rooms, starting = node_rooms(TopicName.parse(topic))
    free = [room.free_memory for room in rooms]
    fit = footprint.fitting(rooms, starting)
    result: dict = {
        "segment_memory_mib": footprint.memory_bytes >> 20,
        "ray_free_memory_gib": round(sum(free) / GIB, 2),
        "fits": fit,
        "machine_used_gib_before": used_gib(),
    }
    started = time.monotonic()
    try:
        admin.create_scalable_topic(topic + "-beyond", fit + 1)
        result["beyond"] = "ADMITTED (wrong)"
    except InsufficientCapacityError as err:
        result["beyond"] = {
            "refused_in_s": round(time.monotonic() - started, 3),
            "message": err.message,
        }
    result["machine_used_gib_after_refusal"] = used_gib()

    started = time.monotonic()
    admin.create_scalable_topic(topic, fit)
    result["create_largest_s"] = round(time.monotonic() - started, 1)
    admin.create_subscription(topic, "s")
    time.sleep(30)  # segment processes finish booting
    result["machine_used_gib_with_largest"] = used_gib()
    values = [f"v{i}".encode() for i in range(args.messages)]
    started = time.monotonic()
    with Producer(topic) as producer:
        producer.send_batch(values, keys=[f"k{i}" for i in range(args.messages)]).result(300)
    consumer = StreamConsumer(topic, "s", "c")
    got = 0
    deadline = time.monotonic() + 300
    while got < args.messages and time.monotonic() < deadline:
        batch = consumer.receive_batch(10_000, timeout=1)
        got += len(batch)
        if batch:
            consumer.acknowledge_cumulative(batch[-1])
    consumer.close()
    result["produce_consume"] = {
        "sent": args.messages,
        "received": got,
        "seconds": round(time.monotonic() - started, 1),
    }
    started = time.monotonic()
    admin.delete_scalable_topic(topic)
    result["delete_largest_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(result, indent=2))
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")


def rest(url: str, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def fill(segments_per_topic: int, settle_s: float) -> dict:
    """Create topics of ``segments_per_topic`` over REST until one is refused; then, once
    ``settle_s`` have passed since the last create, what the full machine serves."""
    from actors.gateway.server import start_gateway
    from clients import Producer, ScalableTopicsAdmin

    url = start_gateway(free_port())
    created: list[str] = []
    started = time.monotonic()
    while True:
        name = f"fill-{len(created)}"
        status, reply = rest(url, "PUT", f"/admin/v2/scalable/capacity/fill/{name}",
                             {"numSegments": segments_per_topic})  # fmt: skip
        if status >= 300:
            break
        created.append(f"topic://capacity/fill/{name}")
        last_create = time.monotonic()
    result: dict = {
        "cores": os.cpu_count(),
        "segments_per_topic": segments_per_topic,
        "topics_admitted": len(created),
        "segments_admitted": len(created) * segments_per_topic,
        "fill_s": round(last_create - started, 1) if created else 0.0,
        "refusal": {"status": status, "error": reply.get("error"), "message": reply.get("message")},
    }
    if not created:
        return result
    time.sleep(max(0.0, last_create + settle_s - CLUSTER_CPU_WINDOW_S - time.monotonic()))
    cores_busy, processes = cluster_cpu_cores(CLUSTER_CPU_WINDOW_S)
    result["cluster_cpu_cores"], result["cluster_processes"] = round(cores_busy, 2), processes
    result["load_average_1m"] = round(os.getloadavg()[0], 2)
    latencies = []
    with Producer(created[0]) as producer:
        for i in range(300):
            sent = time.monotonic()
            producer.send(f"v{i}".encode(), key=f"k{i}").result(30)
            latencies.append((time.monotonic() - sent) * 1000)
    latencies.sort()
    result["send_ack_ms"] = {
        "p50": round(latencies[len(latencies) // 2], 1),
        "p99": round(latencies[int(len(latencies) * 0.99) - 1], 1),
        "max": round(latencies[-1], 1),
    }
    admin = ScalableTopicsAdmin()
    stats_ms = []
    for _ in range(5):
        asked = time.monotonic()
        admin.get_stats(created[-1])
        stats_ms.append((time.monotonic() - asked) * 1000)
    result["get_stats_ms_max"] = round(max(stats_ms), 1)
    result["load_average_1m_after"] = round(os.getloadavg()[0], 2)
    return result


CLUSTER_CPU_WINDOW_S = 10.0


def cluster_processes() -> list[psutil.Process]:
    """This program's Ray: the processes naming its session, and their descendants
    (workers and agents), whatever else runs on the machine."""
    import ray

    session = ray._private.worker.global_worker.node.session_name
    found: dict[int, psutil.Process] = {}
    for process in psutil.process_iter(["cmdline"]):
        if session in " ".join(process.info["cmdline"] or []):
            with contextlib.suppress(psutil.Error):
                for member in [process, *process.children(recursive=True)]:
                    found[member.pid] = member
    return list(found.values())


def cluster_cpu_cores(window_s: float) -> tuple[float, int]:
    """Cores this program's Ray kept busy over ``window_s`` (the load it puts on the
    machine, unlike the load average, which counts the machine's other work too), and
    how many processes it ran at the end."""

    def cpu_s(process: psutil.Process) -> float:
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            return times.user + times.system
        return 0.0

    before = {p.pid: cpu_s(p) for p in cluster_processes()}
    time.sleep(window_s)
    after = cluster_processes()
    used = sum(cpu_s(p) - before.get(p.pid, 0.0) for p in after)
    return used / window_s, len(after)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


if __name__ == "__main__":
    main()
