"""Everything a topic is made of survives ``ray stop --force`` and ``ray start --head``.

A real Redis server (append-only file) holds the GCS of a real ``ray start --head``
(Ray's GCS fault tolerance). A first program builds a topic with a split in its
history, two subscriptions, a policy, namespace limits and a stream consumer that
acknowledged part of what it read and then vanished without leaving. Then every
process of that head is SIGKILLed and the head is started again on the same Redis
and port. Before any admin call, Ray alone must have brought the controller, the
segments and the coordinator host back; then the metadata (topic, subscriptions, the
consumer's registration, cursors, policy, limits) must read as before, and the
consumer must get exactly what it had not acknowledged, once each, in key order,
parents before children. A subscription reset to a moment before the restart owes
exactly what came after that moment. Nothing here could pass on an in-memory GCS.
Transactions left open, decided and forgotten ride the same restart
(``tests/txn_restart.py``: its programs and checks).

The programs run as subprocesses (this file as a script: ``before``, ``actors``,
``after``), since a driver joins one Ray for life and this session's other tests
share another. ``tests/ray_head.py`` explains why the head is stopped by killing
exactly its processes rather than with ``ray stop``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration  # Rays of its own (own storage root and Ray temp dir)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import txn_restart  # noqa: E402
from tests.chaos.invariants import delivery_violations  # noqa: E402
from tests.ray_head import head_on_redis, redis_server_binary, run_phase  # noqa: E402

NAMESPACE = "restart/orders"
TOPIC = f"topic://{NAMESPACE}/events"
SUBSCRIPTIONS = ("s", "other")
POLICY = {"retention": {"timeS": 86400}}
MAX_MESSAGE_BYTES = 300_000
SEGMENTS = 4
SPLIT = 0  # the segment split while the producer writes
KEYS_PER_SEGMENT = 5
ROUNDS = 60  # one message per key per round
SPLIT_AT_ROUND = 20
# c1 receives all that segments 0-3 hold before the restart and acknowledges this part
# of each (the rest stays delivered but unacknowledged); the split's children wait
# for segment 0 to be finished.
ACKED = 0.4
ACTORS_DEADLINE_S = 60.0
RECEIVE_DEADLINE_S = 60.0
QUIET_S = 2.0  # after the last expected message: long enough to see a duplicate
# Topics whose sealed segments hibernate before the restart: one tiered (its sealed
# segments are records in metadata and files in the tier), one whose drained sealed
# segments sleep on local disk. Neither may be woken by the restart or by observing it.
HIBERNATING = {
    f"topic://{NAMESPACE}/archive": "tiering",
    f"topic://{NAMESPACE}/idle": "hibernation",
}
# A topic written with zstd whose subscription was reset to a moment t1 between phase A
# and phase B (then a split, phase C) before the restart: the moved cursors are state too.
REPLAY = f"topic://{NAMESPACE}/replay"


@pytest.mark.timeout(480)
def test_topic_state_actors_and_transactions_survive_a_head_restart(tmp_path: Path) -> None:
    assert redis_server_binary(), "redis-server is missing: ./dev.sh test installs it"
    with head_on_redis(tmp_path) as head:
        namespace = f"restart-{uuid.uuid4().hex[:8]}"

        tier = {"RAYTOPICS_TIER_URIS": f"file://{tmp_path}/tier/"}
        (tmp_path / "txn").mkdir()

        def run(phase: str, script: str = __file__, timeout_s: float = 180) -> dict[str, Any]:
            out = tmp_path / ("txn" if script != __file__ else "") / f"{phase}.json"
            return run_phase(script, phase, out, head.env(namespace) | tier, timeout_s)

        before = run("before")
        txn_before = run("before", txn_restart.__file__)  # last: its short time-out
        assert head.kill() > 0
        head.start()
        actors = run("actors")  # before any admin call
        after = run("after")
        txn_after = run("after", txn_restart.__file__, timeout_s=300)

    txn_restart.check(txn_before, txn_after)

    assert set(actors["alive"]) >= _actor_names(before["layout"]), actors
    assert all(pid not in before["actor_pids"] for pid in actors["pids"]), "not restarted?"

    assert sorted(after["topics"]) == sorted([TOPIC, REPLAY, *HIBERNATING])
    assert after["layout"] == before["layout"]  # the split is in it: 4 + 2 segments
    assert len(after["layout"]["segments"]) == SEGMENTS + 2
    assert sorted(after["subscriptions"]) == sorted(SUBSCRIPTIONS)
    assert after["policy"] == before["policy"]
    assert after["policy"]["retention"]["timeS"] == POLICY["retention"]["timeS"]
    assert (
        after["limits"]["max_message_bytes"]
        == MAX_MESSAGE_BYTES
        == before["limits"]["max_message_bytes"]
    )
    stats, old = after["stats"], before["stats"]
    assert stats["subscriptions"]["s"]["consumers"] == 1, "c1's registration is gone"
    assert stats["subscriptions"]["other"]["consumers"] == 0
    for sub in SUBSCRIPTIONS:
        assert stats["subscriptions"][sub]["backlog"] == old["subscriptions"][sub]["backlog"]
    assert _cursors(stats) == _cursors(old)
    assert stats["records"] == old["records"] == len(before["produced"])

    produced = [tuple(m) for m in before["produced"]]
    acked = {tuple(m) for m in before["acked"]}
    assert acked and len(before["received_unacked"]) > 0
    owed = [m for m in produced if m not in acked]
    c1 = [(key, seq) for key, seq, _ in after["received"]["s"]]
    assert delivery_violations(owed, c1, exactly_once=True) == []
    assert len(c1) == len(owed), "something was delivered that was not owed"
    assert not acked & set(c1), "acknowledged messages came back"
    assert _children_after_parents(after["received"]["s"], after["layout"]) == []
    children = after["layout"]["segments"][str(SPLIT)]["childIds"]
    assert {SPLIT, *children} <= {sid for _, _, sid in after["received"]["s"]}, "order unchecked"

    other = [(key, seq) for key, seq, _ in after["received"]["other"]]
    assert delivery_violations(produced, other, exactly_once=True) == []
    assert len(other) == len(produced)
    assert _children_after_parents(after["received"]["other"], after["layout"]) == []

    for topic, kind in HIBERNATING.items():
        sent = [tuple(m) for m in before["hibernating"][topic]]
        woken = after["hibernating"][topic]
        assert woken["asleep_after_restart"] == 2, (topic, woken)  # stats woke none
        assert woken["tiered"] == (2 if kind == "tiering" else 0), (topic, woken)
        got = [tuple(m) for m in woken["received"]]
        assert delivery_violations(sent, got, exactly_once=True) == [], topic
        assert len(got) == len(sent), topic

    replay, replayed = before["replay"], after["replay"]
    owed = [tuple(m) for m in replay["after_t1"]]
    got = [(key, seq) for key, seq, _ in replayed["received"]]
    assert replayed["backlog"] == len(owed) == replay["backlog"]
    assert delivery_violations(owed, got, exactly_once=True) == []
    assert len(got) == len(owed), "messages from before t1 came back"
    assert _children_after_parents(replayed["received"], replayed["layout"]) == []
    # The oldest unacknowledged message is phase B's first: published after t1.
    age_bound_s = (replayed["stats_at_ms"] - replay["t1_ms"]) / 1000
    assert 0 < replayed["backlog_age_s"] <= age_bound_s + 0.5, (replayed, replay["t1_ms"])


def _actor_names(layout: dict[str, Any]) -> frozenset[str]:
    """What Ray must restart for the topic: its controller, the host of every segment of
    the layout (sealed ones too: their backlog is still read) and the coordinator host."""
    from runtime.names import TopicName
    from runtime.segment_hosts import (
        controller_host_name,
        coordinator_host_name,
        host_name,
        hosts_per_namespace,
    )

    name = TopicName.parse(TOPIC)
    segments = {
        host_name(
            name.segment(int(sid), s["hashRange"]["start"], s["hashRange"]["end"]),
            None,
            hosts_per_namespace(),
        )
        for sid, s in layout["segments"].items()
    }
    return frozenset({controller_host_name(name), coordinator_host_name(name), *segments})


def _cursors(stats: dict[str, Any]) -> dict[str, dict[str, int]]:
    return {
        sid: {sub: c["markDelete"] for sub, c in seg["subscriptions"].items()}
        for sid, seg in stats["segments"].items()
    }


def _children_after_parents(deliveries: list[list], layout: dict[str, Any]) -> list[str]:
    """A child's first delivery must come after its parents' last one."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, (_, _, sid) in enumerate(deliveries):
        first.setdefault(sid, i)
        last[sid] = i
    return [
        f"segment {sid} delivered (#{first[int(sid)]}) before parent {p} finished (#{last[p]})"
        for sid, seg in layout["segments"].items()
        for p in seg["parentIds"]
        if int(sid) in first and p in last and first[int(sid)] < last[p]
    ]


# --- the programs (run as subprocesses, joined to the head by RAY_ADDRESS) ------------


def _keys() -> list[str]:
    """KEYS_PER_SEGMENT keys in each initial segment, at least two in each half of the
    one that gets split, so both children take writes."""
    from runtime.hashing import key_hash

    width = 0x10000 // SEGMENTS
    mid = SPLIT * width + width // 2
    buckets: dict[int, list[str]] = {i: [] for i in range(SEGMENTS)}
    halves = {True: 0, False: 0}
    i = 0
    while any(len(b) < KEYS_PER_SEGMENT for b in buckets.values()) or min(halves.values()) < 2:
        key, i = f"order-{i}", i + 1
        h = key_hash(key)
        bucket = buckets[h // width]
        if len(bucket) < KEYS_PER_SEGMENT or (h // width == SPLIT and halves[h < mid] < 2):
            bucket.append(key)
            if h // width == SPLIT:
                halves[h < mid] += 1
    return [k for b in buckets.values() for k in b]


def before(out: Path) -> None:
    """Build the topic's state, write what was produced and acked, and vanish."""
    from clients import Producer, ScalableTopicsAdmin, StreamConsumer

    admin = ScalableTopicsAdmin()
    hibernating = {topic: _to_hibernate(admin, topic, kind) for topic, kind in HIBERNATING.items()}
    admin.create_scalable_topic(TOPIC, SEGMENTS)
    for sub in SUBSCRIPTIONS:
        admin.create_subscription(TOPIC, sub)
    admin.set_policy(TOPIC, POLICY)
    admin.set_namespace_limits(NAMESPACE, max_message_bytes=MAX_MESSAGE_BYTES)

    keys = _keys()
    produced: list[tuple[str, int]] = []
    sent_rounds = threading.Semaphore(0)
    split = threading.Event()
    with Producer(TOPIC) as producer:

        def produce() -> None:
            seq, after_split = 0, 0
            # At least ROUNDS rounds, and some after the split however long it takes
            while seq < ROUNDS or after_split < ROUNDS - SPLIT_AT_ROUND:
                producer.send_batch([f"{k}:{seq}".encode() for k in keys], keys=keys)
                produced.extend((k, seq) for k in keys)
                sent_rounds.release()
                after_split += split.is_set()
                seq += 1
                time.sleep(0.02)

        writer = threading.Thread(target=produce)
        writer.start()
        for _ in range(SPLIT_AT_ROUND):
            sent_rounds.acquire()
        admin.split_segment(TOPIC, SPLIT)
        split_done_at = len(produced)
        split.set()
        writer.join()
    assert 0 < split_done_at < len(produced), "the split did not happen while producing"

    consumer = StreamConsumer(TOPIC, "s", "c1")
    in_roots = sum(admin.get_stats(TOPIC)["segments"][str(i)]["records"] for i in range(SEGMENTS))
    received = _receive(consumer, in_roots, acknowledge=False)
    assert len(received) == in_roots, f"c1 got {len(received)} of {in_roots} before the restart"
    acked, unacked = [], []
    for sid in range(SEGMENTS):
        mine = [m for m in received if m.segment_id == sid]
        part = int(len(mine) * ACKED)
        assert 0 < part < len(mine), f"segment {sid}: {len(mine)} messages"
        consumer.acknowledge_cumulative(mine[part - 1])  # this and all before, in segment sid
        acked += mine[:part]
        unacked += mine[part:]
    backlog = len(produced) - len(acked)
    deadline = time.monotonic() + 30
    while (stats := admin.get_stats(TOPIC))["subscriptions"]["s"]["backlog"] != backlog:
        assert time.monotonic() < deadline, "acknowledgements did not reach the segments"
        time.sleep(0.05)

    import ray._private.state as state

    result = {
        "produced": produced,
        "acked": [[m.key, _seq(m)] for m in acked],
        "received_unacked": [[m.key, _seq(m)] for m in unacked],
        "layout": admin.get_metadata(TOPIC),
        "stats": stats,
        "policy": admin.get_policy(TOPIC),
        "limits": admin.get_namespace_limits(NAMESPACE),
        "actor_pids": [a["Pid"] for a in state.actors().values() if a["State"] == "ALIVE"],
        "hibernating": {topic: _asleep(admin, topic, sent) for topic, sent in hibernating.items()},
        "replay": _reset_to_t1(admin),
    }
    out.write_text(json.dumps(result))
    # No close(), no atexit: c1 stays registered, as after a crash.
    os._exit(0)


def actors(out: Path) -> None:
    """Wait until Ray itself has restarted every actor of the topic: no admin call, no
    metadata read (the names come from what ``before`` wrote)."""
    import ray
    import ray._private.state as state

    from runtime import connect

    layout = json.loads((out.parent / "before.json").read_text())["layout"]
    expected = _actor_names(layout)
    connect()
    deadline = time.monotonic() + ACTORS_DEADLINE_S
    while True:
        # GCS's actor table, as `ray list actors` shows it, without needing the dashboard.
        found = {a["Name"]: a for a in state.actors().values() if a["Name"]}
        alive = {n for n, a in found.items() if a["State"] == "ALIVE"}
        if expected <= alive or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    named = {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)}
    out.write_text(
        json.dumps(
            {
                "alive": sorted(alive & named),
                "states": {n: found[n]["State"] for n in sorted(found)},
                "pids": [found[n]["Pid"] for n in sorted(alive)],
            }
        )
    )


def after(out: Path) -> None:
    """Read the metadata back, then consume what each subscription is owed."""
    from clients import ScalableTopicsAdmin, StreamConsumer

    admin = ScalableTopicsAdmin()
    result: dict[str, Any] = {
        "topics": admin.list_scalable_topics(NAMESPACE),
        "layout": admin.get_metadata(TOPIC),
        "subscriptions": admin.list_subscriptions(TOPIC),
        "stats": admin.get_stats(TOPIC),  # before c1 comes back: the restored registration
        "policy": admin.get_policy(TOPIC),
        "limits": admin.get_namespace_limits(NAMESPACE),
        "received": {},
    }
    for sub, consumer_name in (("s", "c1"), ("other", "o1")):
        owed = result["stats"]["subscriptions"][sub]["backlog"]
        consumer = StreamConsumer(TOPIC, sub, consumer_name)
        got = _receive(consumer, owed, acknowledge=True, deadline_s=RECEIVE_DEADLINE_S)
        got += _receive(consumer, 1, acknowledge=True, deadline_s=QUIET_S)  # must be none
        consumer.close()
        result["received"][sub] = [[m.key, _seq(m), m.segment_id] for m in got]
    result["hibernating"] = {}
    for topic in HIBERNATING:
        segments = admin.get_stats(topic)["segments"].values()
        expected = sum(s["records"] for s in segments)
        admin.create_subscription(topic, "late", "earliest")
        consumer = StreamConsumer(topic, "late", "l1")
        got = _receive(consumer, expected, acknowledge=True, deadline_s=RECEIVE_DEADLINE_S)
        consumer.close()
        result["hibernating"][topic] = {
            "asleep_after_restart": sum(1 for s in segments if s["hibernating"]),
            "tiered": sum(1 for s in segments if s["tiered"]),
            "received": [[m.key, _seq(m)] for m in got],
        }
    consumer = StreamConsumer(REPLAY, "replay", "r1")
    owed = admin.get_stats(REPLAY)["subscriptions"]["replay"]
    got = _receive(consumer, owed["backlog"], acknowledge=True, deadline_s=RECEIVE_DEADLINE_S)
    got += _receive(consumer, 1, acknowledge=True, deadline_s=QUIET_S)  # must be none
    consumer.close()
    result["replay"] = {
        "backlog": owed["backlog"],
        "backlog_age_s": owed["backlogAgeS"],
        "stats_at_ms": time.time_ns() // 1_000_000,
        "layout": admin.get_metadata(REPLAY),
        "received": [[m.key, _seq(m), m.segment_id] for m in got],
    }
    out.write_text(json.dumps(result))


def _reset_to_t1(admin: Any) -> dict[str, Any]:
    """Phase A, t1, phase B, a split, phase C (zstd), then the subscription is reset to
    t1 with no consumer connected: what it owes is B and C."""
    from clients import Producer

    admin.create_scalable_topic(REPLAY, 2)
    admin.create_subscription(REPLAY, "replay", "latest")
    keys = _keys()
    with Producer(REPLAY, compression="zstd") as producer:
        producer.send_batch([f"{k}:0".encode() for k in keys], keys=keys).result()
        time.sleep(0.05)
        t1_ms = time.time_ns() // 1_000_000
        time.sleep(0.05)
        producer.send_batch([f"{k}:1".encode() for k in keys], keys=keys).result()
        admin.split_segment(REPLAY, 0)
        producer.send_batch([f"{k}:2".encode() for k in keys], keys=keys).result()
    admin.reset_subscription(REPLAY, "replay", t1_ms)
    backlog = admin.get_stats(REPLAY)["subscriptions"]["replay"]["backlog"]
    after_t1 = [(k, seq) for seq in (1, 2) for k in keys]
    return {"t1_ms": t1_ms, "after_t1": after_t1, "backlog": backlog}


def _to_hibernate(admin: Any, topic: str, kind: str) -> list[tuple[str, int]]:
    """A topic whose two sealed segments will hibernate (``kind`` of policy); what was
    sent to it, which its ``drained`` subscription acknowledges whole."""
    from clients import Producer, StreamConsumer

    admin.create_scalable_topic(topic, 2)
    admin.create_subscription(topic, "drained", "earliest")
    if kind == "tiering":
        uri = f"{os.environ['RAYTOPICS_TIER_URIS']}{uuid.uuid4().hex[:8]}"
        admin.set_policy(topic, {"tiering": {"uri": uri, "afterS": 0, "idleS": 1}})
    else:
        admin.set_policy(topic, {"hibernation": {"idleS": 1}})
    keys = _keys()
    with Producer(topic) as producer:
        producer.send_batch([f"{k}:0".encode() for k in keys], keys=keys)
        admin.split_segment(topic, 0)
        admin.split_segment(topic, 1)
        producer.send_batch([f"{k}:1".encode() for k in keys], keys=keys)
    sent = [(k, seq) for seq in (0, 1) for k in keys]
    consumer = StreamConsumer(topic, "drained", "d1")
    assert len(_receive(consumer, len(sent), acknowledge=True)) == len(sent)
    consumer.close()
    return sent


def _asleep(admin: Any, topic: str, sent: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """Wait until the topic's two sealed segments hibernate; returns what was sent."""
    deadline = time.monotonic() + 60
    while True:
        sealed = [s for s in admin.get_stats(topic)["segments"].values() if s["terminated"]]
        if len(sealed) == 2 and all(s["hibernating"] for s in sealed):
            return sent
        assert time.monotonic() < deadline, sealed
        time.sleep(0.3)


def _receive(consumer: Any, count: int, *, acknowledge: bool, deadline_s: float = 30.0) -> list:
    """Up to ``count`` messages (fewer if ``deadline_s`` passes first), acknowledged
    cumulatively batch by batch when ``acknowledge``."""
    got: list = []
    deadline = time.monotonic() + deadline_s
    while len(got) < count and (left := deadline - time.monotonic()) > 0:
        batch = consumer.receive_batch(count - len(got), timeout=min(left, 1.0))
        if batch and acknowledge:
            consumer.acknowledge_cumulative(batch)
        got += batch
    return got


def _seq(message: Any) -> int:
    return int(message.value.decode().rsplit(":", 1)[1])


if __name__ == "__main__":
    {"before": before, "actors": actors, "after": after}[sys.argv[1]](Path(sys.argv[2]))
