"""A continuous Spark pipeline: read topic A as a stream, transform, write topic B.

Each micro-batch reads what A received (a segment only after its parents were
read to their end, so every key stays in order through splits and merges),
upper-cases the values, and writes them to B, keys kept. Progress is in the
checkpoint directory: stop the program (Ctrl-C, or kill it) and start it again
with the same ``--checkpoint`` and it resumes after the last committed batch;
the sink stores a replayed batch only once, so B holds each result exactly once.

    .venv/bin/python examples/spark_streaming.py --input topic://acme/in/events \\
        --output topic://acme/out/events --checkpoint /tmp/cp      # embedded local Ray
    ray job submit --working-dir . -- python examples/spark_streaming.py --input … --output …

``--demo`` makes its own topics, produces while splitting A, stops the query
mid-way and starts it again, and checks B; it exits 1 on any difference.
``--available-now`` processes what A holds and exits; otherwise it runs until
``--run-seconds`` pass (default: forever). Needs Java 17.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
import uuid
from collections import Counter
from typing import Any


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", help="the topic to read (topic://tenant/ns/name)")
    parser.add_argument("--output", help="the topic to write (created if missing)")
    parser.add_argument("--checkpoint", help="the query's checkpoint directory")
    parser.add_argument("--available-now", action="store_true", help="process what is there, exit")
    parser.add_argument("--run-seconds", type=float, default=None, help="stop after this long")
    parser.add_argument(
        "--max-per-batch", type=int, default=5000, help="records per micro-batch at most"
    )
    parser.add_argument("--demo", action="store_true", help="run the self-checking demo")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    from runtime import connect

    embedded = {} if "RAY_ADDRESS" in os.environ else {"include_dashboard": False}
    connect(log_to_driver=False, **embedded)
    if args.demo:
        return demo()
    if not (args.input and args.output and args.checkpoint):
        parser.error("--input, --output and --checkpoint are required (or --demo)")
    spark = start_spark()
    ensure_topic(args.output)
    query = pipeline(
        spark, args.input, args.output, args.checkpoint, args.available_now, args.max_per_batch
    )
    print(f"streaming {args.input} -> {args.output} (checkpoint {args.checkpoint})", flush=True)
    if args.available_now or args.run_seconds is None:
        query.awaitTermination()
    else:
        query.awaitTermination(args.run_seconds)
        query.stop()
    return 0


def start_spark() -> Any:
    from clients.spark import warm_up
    from clients.spark_session import spark_session

    # Its raytopics source and sink plan through this node's gateway (started if none runs)
    spark = spark_session("raytopics-streaming", configs={"spark.sql.shuffle.partitions": "2"})
    warm_up(spark)
    return spark


def ensure_topic(topic: str, segments: int = 2) -> None:
    from clients import ScalableTopicsAdmin
    from runtime.errors import TopicAlreadyExistsError

    with contextlib.suppress(TopicAlreadyExistsError):
        ScalableTopicsAdmin().create_scalable_topic(topic, segments)


def pipeline(
    spark: Any,
    source: str,
    sink: str,
    checkpoint: str,
    available_now: bool,
    max_per_batch: int = 5000,
) -> Any:
    """A → upper-cased values, keys kept → B; the checkpoint keeps where it stands."""
    from pyspark.sql import functions as F

    events = (
        spark.readStream.format("raytopics")
        .option("topic", source)
        .option("startingOffsets", "earliest")
        .option("maxMessagesPerTrigger", str(max_per_batch))
        .load()
    )
    shouted = events.select(
        "key", F.upper(F.col("value").cast("string")).cast("binary").alias("value")
    )
    writer = (
        shouted.writeStream.format("raytopics")
        .option("topic", sink)
        .option("checkpointLocation", checkpoint)
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime="1 second")
    return writer.start()


def demo() -> int:
    """Produce to A while splitting it, stop the query half-way and start it again, then
    compare B with A: each message exactly once, upper-cased."""
    from clients import Producer, ScalableTopicsAdmin
    from clients.spark import read_topic
    from clients.spark_session import stop_spark

    admin = ScalableTopicsAdmin()
    run = uuid.uuid4().hex[:8]
    source, sink = f"topic://demo/stream/in-{run}", f"topic://demo/stream/out-{run}"
    admin.create_scalable_topic(source, 2)
    admin.create_scalable_topic(sink, 2)
    checkpoint = tempfile.mkdtemp(prefix="raytopics-stream-cp-")
    sent: list[str] = []

    def produce(n: int) -> None:
        with Producer(source) as producer:
            for i in range(n):
                value = f"event-{len(sent)}"
                producer.send(value.encode(), key=f"user-{i % 50}")
                sent.append(value)

    try:
        spark = start_spark()
        produce(2_000)
        query = pipeline(spark, source, sink, checkpoint, available_now=False)
        time.sleep(3)
        admin.split_segment(source, 0)
        produce(2_000)
        time.sleep(3)
        query.stop()
        print("query stopped; producing more while it is down", flush=True)
        produce(1_000)
        admin.split_segment(source, 1)
        query = pipeline(spark, source, sink, checkpoint, available_now=True)
        query.awaitTermination()
        got = Counter(bytes(r.value).decode() for r in read_topic(spark, sink).collect())
    finally:
        stop_spark()
        admin.delete_scalable_topic(source)
        admin.delete_scalable_topic(sink)
    expected = Counter(v.upper() for v in sent)
    missing, twice = expected - got, {v: n for v, n in got.items() if n > 1}
    print(f"sent {len(sent)}, written {sum(got.values())}, missing {sum(missing.values())}, "
          f"duplicated {len(twice)}")  # fmt: skip
    if got != expected:
        return 1
    print(f"spark_streaming OK: {len(sent)} events, each written once through 2 splits "
          "and a restart", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
