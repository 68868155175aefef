"""Capacity: the largest topic admission allows on this machine, and one beyond it.

On an embedded Ray of its own (a temporary storage root): how many segments
fit (``runtime.capacity`` over Ray's free memory), how fast a topic one
segment larger is refused and whether the machine's memory moves, then the
largest topic that fits: how long its create takes, what the machine's memory
is once its segment processes run, and whether a producer and a consumer on
it still deliver every message.

    .venv/bin/python bench/capacity.py [--messages 20000]

Writes ``bench/results/capacity.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RESULTS = Path(__file__).resolve().parent / "results" / "capacity.json"
GIB = 1 << 30


def used_gib() -> float:
    memory = psutil.virtual_memory()
    return round((memory.total - memory.available) / GIB, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=20_000)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="capacity-bench-")
    os.environ["RAYTOPICS_STORAGE_ROOT"] = root
    os.environ["RAYTOPICS_NAMESPACE"] = f"capacity-{uuid.uuid4().hex[:6]}"
    from runtime import connect

    connect("local", include_dashboard=False, log_to_driver=False)
    from actors.capacity import free_memory_per_node
    from clients import Producer, ScalableTopicsAdmin, StreamConsumer
    from runtime.capacity import SegmentFootprint
    from runtime.errors import InsufficientCapacityError
    from runtime.names import TopicName

    admin = ScalableTopicsAdmin()
    topic = "topic://capacity/bench/largest"
    footprint = SegmentFootprint.from_env()
    free = free_memory_per_node(TopicName.parse(topic))
    fit = footprint.fitting(free)
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


if __name__ == "__main__":
    main()
