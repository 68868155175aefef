"""The product in two minutes: a topic that grows and shrinks under load while it is
written and read, and a Spark query over it.

1. A topic of 2 segments with an autoscale policy, a subscription read by two
   stream consumers.
2. Producers at rising load: warm-up, then a rush well above what two segments
   should take. The controller splits hot segments while the consumers keep
   reading, each key's messages in order.
3. The load falls: cold neighbours merge back.
4. Every message produced was consumed once, each key in order (checked).
5. Spark on Ray (RayDP) reads the whole DAG, sealed segments included.
6. The final DAG and stats.

    ./dev.sh demo                                                  # embedded local Ray
    ray job submit --working-dir . -- python examples/demo.py      # a running cluster

The topic stays for a look afterwards (``raytopics describe demo/shop/orders``);
each run replaces the last one's.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

TOPIC = "topic://demo/shop/orders"
SUBSCRIPTION = "audit"
KEYS = 200
TARGET_MSGS_PER_S = 1_500
POLICY = {
    "autoscale": {
        "targetMsgsPerS": TARGET_MSGS_PER_S,
        "minSegments": 2,
        "maxSegments": 8,
        "cooldownS": 3,
        "windowS": 3,
    }
}
# (phase, messages per second, the longest it lasts): the rush ends once the topic
# split twice, the calm once it merged back to two segments.
PHASES = (("warm-up", 400, 6.0), ("rush", 6_000, 40.0), ("calm", 150, 60.0))
TICK_S = 0.05


@dataclass
class Run:
    """What the demo's threads share; counts are read by the status line."""

    rate: float = 0.0
    producing: bool = True
    produced: int = 0
    sent: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    received: list[tuple[str, int]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    splits: int = 0
    merges: int = 0
    failure: BaseException | None = None


def main() -> int:
    from clients import ScalableTopicsAdmin
    from runtime import connect

    connect(log_to_driver=False)  # Spark's and Ray's workers' logs stay in Ray's log files
    admin = ScalableTopicsAdmin()
    fresh_topic(admin)
    run = Run()
    threads = [threading.Thread(target=produce, args=(run,), daemon=True)]
    threads += [
        threading.Thread(target=consume, args=(run, f"audit-{i}"), daemon=True) for i in (1, 2)
    ]
    for thread in threads:
        thread.start()
    watch = Watch(admin, run)
    for phase, rate, longest in PHASES:
        run.rate = rate
        watch.until(phase, longest, done=_phase_done(phase, run, admin))
    run.producing = False
    watch.until("draining", 60.0, done=lambda: len(run.received) >= run.produced)
    for thread in threads:
        thread.join(10)
    print()
    if run.failure is not None:
        print(f"demo FAILED: {type(run.failure).__name__}: {run.failure}")
        return 1
    ok = order_check(run)
    spark_query(run.produced)
    final_state(admin)
    return 0 if ok else 1


def fresh_topic(admin: Any) -> None:
    if TOPIC in admin.list_scalable_topics("demo/shop"):
        admin.delete_scalable_topic(TOPIC)
    admin.create_scalable_topic(TOPIC, 2)
    admin.set_policy(TOPIC, POLICY)
    admin.create_subscription(TOPIC, SUBSCRIPTION)
    admin.wait_until_ready(TOPIC, 120)
    auto = POLICY["autoscale"]
    print(
        f"created {TOPIC}: 2 segments; autoscale splits a segment above "
        f"{auto['targetMsgsPerS']:,} msgs/s and merges cold neighbours; subscription "
        f"'{SUBSCRIPTION}' read by two stream consumers"
    )


def _phase_done(phase: str, run: Run, admin: Any) -> Callable[[], bool]:
    if phase == "rush":
        return lambda: run.splits >= 2
    if phase == "calm":
        return lambda: run.merges >= 1 and len(admin.get_layout(TOPIC).active_segments) <= 2
    return lambda: False


# --- the threads ------------------------------------------------------------------------


def produce(run: Run) -> None:
    """Keyed orders at ``run.rate`` a second, in batches each tick."""
    from clients import Producer

    try:
        with Producer(TOPIC) as producer:
            started, due = time.monotonic(), 0.0
            while run.producing:
                due += run.rate * TICK_S
                count = int(due)
                due -= count
                if count:
                    values, keys = _orders(run, count)
                    producer.send_batch(values, keys=keys)
                    run.produced += count
                started += TICK_S
                time.sleep(max(0.0, started - time.monotonic()))
    except BaseException as err:  # the main thread reports it
        run.failure = err


def _orders(run: Run, count: int) -> tuple[list[bytes], list[str]]:
    values, keys = [], []
    for i in range(count):
        customer = f"customer-{(run.produced + i) * 7919 % KEYS}"
        seq = run.sent[customer]
        run.sent[customer] = seq + 1
        spend = (seq * 37 + (run.produced + i) * 7919 % KEYS * 53) % 500
        order = {"customer": customer, "seq": seq, "amount": spend}
        values.append(json.dumps(order).encode())
        keys.append(customer)
    return values, keys


def consume(run: Run, name: str) -> None:
    """Receive, note each order's (customer, seq), acknowledge."""
    from clients import StreamConsumer

    try:
        consumer = StreamConsumer(TOPIC, SUBSCRIPTION, name)
        while run.producing or len(run.received) < run.produced:
            batch = consumer.receive_batch(1_000, timeout=0.2)
            if batch:
                with run.lock:
                    run.received.extend((m.key, json.loads(m.value)["seq"]) for m in batch)
                consumer.acknowledge_cumulative(batch)
        consumer.close()
    except BaseException as err:
        run.failure = err


# --- watching -----------------------------------------------------------------------------


class Watch:
    """Prints each split and merge as it happens, under a live status line."""

    def __init__(self, admin: Any, run: Run) -> None:
        self.admin, self.run = admin, run
        self.active = set(admin.get_layout(TOPIC).active_segments)
        self.live = sys.stdout.isatty()
        self.said_at = 0.0

    def until(self, phase: str, longest_s: float, done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + longest_s
        while time.monotonic() < deadline and self.run.failure is None:
            self._changes()
            self._status(phase)
            if done():
                break
            time.sleep(0.25)

    def _changes(self) -> None:
        layout = self.admin.get_layout(TOPIC)
        active = set(layout.active_segments)
        for sealed in sorted(self.active - active):
            children = layout.all_segments[sealed].child_ids
            others = sorted(set(layout.all_segments[children[0]].parent_ids) - {sealed})
            if len(children) == 2:
                self.run.splits += 1
                self._say(f"split   #{sealed} -> #{children[0]} + #{children[1]}")
            elif sealed < min(others, default=sealed + 1):  # a merge seals two: say it once
                self.run.merges += 1
                self._say(f"merged  #{sealed} + #{others[0]} -> #{children[0]}")
        self.active = active

    def _say(self, event: str) -> None:
        clear = "\r\x1b[2K" if self.live else ""
        print(f"{clear}{time.strftime('%H:%M:%S')}  {event}", flush=True)

    def _status(self, phase: str) -> None:
        run = self.run
        line = (
            f"{phase:<8} {run.rate:>6,.0f} msgs/s | produced {run.produced:>7,} | "
            f"consumed {len(run.received):>7,} | {len(self.active)} active segments | "
            f"splits {run.splits} merges {run.merges}"
        )
        if self.live:
            print(f"\r\x1b[2K{line}", end="", flush=True)
        elif time.monotonic() - self.said_at >= 5:
            print(line, flush=True)
            self.said_at = time.monotonic()


# --- the checks and the end ----------------------------------------------------------------


def order_check(run: Run) -> bool:
    per_key: dict[str, list[int]] = defaultdict(list)
    for key, seq in run.received:
        per_key[key].append(seq)
    broken = [k for k, seqs in per_key.items() if seqs != list(range(run.sent[k]))]
    missing = [k for k in run.sent if k not in per_key]
    print(f"produced {run.produced:,} messages, consumed {len(run.received):,}")
    if broken or missing or len(run.received) != run.produced:
        print(f"order check FAILED: {len(broken) + len(missing)} keys lost, repeated or reordered")
        return False
    print(
        f"order check: every one of {len(per_key)} keys arrived complete, once and in order, "
        f"across {run.splits} splits and {run.merges} merges"
    )
    return True


def spark_query(produced: int) -> None:
    """The whole topic (sealed parents and active children) as one DataFrame."""
    from pyspark.sql import functions as F

    from clients.spark import read_topic
    from clients.spark_session import spark_session, stop_spark

    print("starting Spark on Ray (RayDP) ...", flush=True)
    spark = spark_session("raytopics-demo")
    try:
        orders = read_topic(spark, TOPIC).select(
            "key", F.get_json_object(F.col("value").cast("string"), "$.amount").cast("int")
            .alias("amount"),
        )  # fmt: skip
        total = orders.count()
        top = orders.groupBy("key").agg(F.sum("amount").alias("spent")).orderBy(F.desc("spent"))
        best = [(row["key"], row["spent"]) for row in top.limit(3).collect()]
    finally:
        stop_spark()
    print(f"Spark: {total:,} rows read (produced {produced:,}); top customers by amount:")
    for key, spent in best:
        print(f"  {key:<14} {spent:>8,}")


def final_state(admin: Any) -> None:
    from clients.cli_format import format_stats
    from runtime.render import render_tree

    print(f"\nthe DAG now:\n{render_tree(admin.get_layout(TOPIC))}\n")
    print(format_stats(admin.get_stats(TOPIC)))
    short = TOPIC.removeprefix("topic://")
    print(
        "\nlook at it in the web console: raytopics serve --port 8080, then open "
        f"http://127.0.0.1:8080/#ns=demo/shop&topic={TOPIC}\n"
        f"or in the shell: raytopics top demo/shop (live rates), raytopics describe {short}, "
        f"raytopics consume {short} --from earliest --max 5 --json"
    )


if __name__ == "__main__":
    sys.exit(main())
