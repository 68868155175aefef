"""Storage identity and recovery on the real local Ray: a re-created name starts empty,
storage no metadata names is found, and lost metadata comes back from storage alone."""

from __future__ import annotations

import os
import threading
import time
from collections import defaultdict

import pytest
import ray
from test_cli import cli_env, raytopics  # noqa: F401 - a fixture and a helper, shared
from test_gateway import free_port, http  # noqa: F401 - a helper

from actors.control.controller_host import controller_actor
from actors.control.dag_watch import dag_watch_actor
from actors.guard import guard
from actors.registry import gone_for_good, lookup
from actors.segment.directory import SegmentDirectory
from actors.segment.host import start_segment_actor
from actors.segment.lookup import served_entries
from clients import AdminHttpClient, Producer, StreamConsumer
from runtime.errors import (
    AmbiguousStorageError,
    InvalidArgumentError,
    StorageNotFoundError,
    TopicAlreadyExistsError,
    TopicNotFoundError,
)
from runtime.names import TopicName
from runtime.segment_hosts import controller_host_name
from storage.catalog import Catalog
from tests.segments import stop_serving


def produce(topic: str, keys: int, rounds: int, start: int = 0) -> list[tuple[str, int]]:
    """``rounds`` messages per key, each carrying its per-key sequence number."""
    sent = []
    with Producer(topic) as producer:
        for seq in range(start, start + rounds):
            for k in range(keys):
                producer.send(f"{seq}".encode(), key=f"key-{k}")
                sent.append((f"key-{k}", seq))
    return sent


def drain(
    consumer: StreamConsumer, expected: int, timeout_s: float = 60.0
) -> list[tuple[str, int]]:
    """Receive until ``expected`` messages came and 1.5 s more brought none; ack each."""
    got: list[tuple[str, int]] = []
    deadline, quiet_until = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        batch = consumer.receive_batch(1_000, timeout=0.3)
        for message in batch:
            got.append((message.key, int(message.value)))
            consumer.acknowledge_cumulative(message)
        if len(got) >= expected:
            quiet_until = quiet_until or time.monotonic() + 1.5
            if not batch and time.monotonic() > quiet_until:
                break
    return got


def take(consumer: StreamConsumer, count: int, timeout_s: float = 30.0) -> list[tuple[str, int]]:
    """Receive and acknowledge exactly ``count`` messages."""
    got: list[tuple[str, int]] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        for message in consumer.receive_batch(count - len(got), timeout=0.3):
            got.append((message.key, int(message.value)))
            consumer.acknowledge_cumulative(message)
    assert len(got) == count
    return got


def assert_once_in_key_order(got: list[tuple[str, int]], expected: list[tuple[str, int]]) -> None:
    assert len(got) == len(set(got)), "duplicates"
    assert sorted(got) == sorted(expected)
    per_key: dict[str, list[int]] = defaultdict(list)
    for key, seq in got:
        per_key[key].append(seq)
    for key, seqs in per_key.items():
        assert seqs == sorted(seqs), f"{key} out of order: {seqs}"


def wipe(topic: str) -> None:
    """Lose a topic's metadata, every record under its path, and nothing else."""
    Catalog().delete_topic(TopicName.parse(topic))


def written(admin, topic: str, rounds: int) -> str:
    """A 2-segment topic with subscription ``s`` and messages; returns its incarnation."""
    admin.create_scalable_topic(topic, 2)
    admin.create_subscription(topic, "s")
    produce(topic, keys=8, rounds=rounds)
    return admin.get_stats(topic)["incarnation"]


def test_a_recreated_name_delivers_nothing_of_the_old_topic(admin, unique):
    topic = f"topic://recov/ns/ident-again-{unique}"
    first = written(admin, topic, rounds=25)
    admin.delete_scalable_topic(topic)

    admin.create_scalable_topic(topic, 2)
    admin.create_subscription(topic, "s")
    assert admin.get_stats(topic)["incarnation"] != first
    fresh = produce(topic, keys=8, rounds=3, start=1_000)
    consumer = StreamConsumer(topic, "s", "c1")
    assert_once_in_key_order(drain(consumer, len(fresh)), fresh)
    consumer.close()
    assert not [o for o in admin.check_storage()["orphaned"] if o["topic"] == topic]
    admin.delete_scalable_topic(topic)


def test_a_namespaces_topics_share_a_host_that_outlives_each_of_them(admin, unique):
    """Creating a topic where its namespace has a host starts no host; deleting one closes
    its segments there while the host serves the other topics on, uninterrupted; the name
    created again is served by the same process with nothing of the old topic."""
    stays, goes = f"topic://share-{unique}/ns/stays", f"topic://share-{unique}/ns/goes"
    for topic in (stays, goes):
        written(admin, topic, rounds=5)
    hosts = {e.host for t in (stays, goes) for e in served_entries(TopicName.parse(t)).values()}
    assert len(hosts) == 1, hosts  # four segments of two topics, one process
    (host,) = hosts
    pid = pid_of(host)

    with Producer(stays) as producer:
        admin.delete_scalable_topic(goes)  # while the other topic is written
        for seq in range(5, 30):
            for k in range(8):
                producer.send(f"{seq}".encode(), key=f"key-{k}")
    consumer = StreamConsumer(stays, "s", "c1")
    expected = [(f"key-{k}", seq) for seq in range(30) for k in range(8)]
    assert_once_in_key_order(drain(consumer, len(expected)), expected)
    consumer.close()
    assert served_entries(TopicName.parse(goes)) == {}

    admin.create_scalable_topic(goes, 2)
    admin.create_subscription(goes, "s")
    fresh = produce(goes, keys=4, rounds=2, start=500)
    consumer = StreamConsumer(goes, "s", "c1")
    assert_once_in_key_order(drain(consumer, len(fresh)), fresh)
    consumer.close()
    entries = served_entries(TopicName.parse(goes)).values()
    assert {e.host for e in entries} == {host}
    assert pid_of(host) == pid, "the same process all along"
    for topic in (stays, goes):
        admin.delete_scalable_topic(topic)


def test_a_host_that_serves_nothing_exits_and_the_next_segment_starts_one(admin, unique):
    """A namespace whose topics are all deleted keeps no process: its host exits once
    it has been idle for ``RAYTOPICS_HOST_IDLE_EXIT_S`` (the session's is short), and a
    topic created there afterwards gets a new host of the same name that serves it."""
    first, second = f"topic://idle-{unique}/ns/first", f"topic://idle-{unique}/ns/second"
    written(admin, first, rounds=2)
    (host,) = {e.host for e in served_entries(TopicName.parse(first)).values()}
    pid = pid_of(host)
    admin.delete_scalable_topic(first)
    wait_until(lambda: gone_for_good(host), 60, f"{host} to exit")

    written(admin, second, rounds=3)
    assert {e.host for e in served_entries(TopicName.parse(second)).values()} == {host}
    assert pid_of(host) != pid, "a new process"
    consumer = StreamConsumer(second, "s", "c1")
    expected = [(f"key-{k}", seq) for seq in range(3) for k in range(8)]
    assert_once_in_key_order(drain(consumer, len(expected)), expected)
    consumer.close()
    admin.delete_scalable_topic(second)


def test_a_starter_waits_for_a_closing_host_to_stay_or_exit(admin, unique):
    """The host marks itself closing before it looks for segments to serve; a starter
    that finds the mark opens its segment only once the host stayed (lifting the mark)
    or exited (in a new host then), so no segment is opened in a process that ends."""
    stays = f"topic://closing-{unique}/ns/stays"
    written(admin, stays, rounds=1)
    (host,) = {e.host for e in served_entries(TopicName.parse(stays)).values()}
    directory, loose = SegmentDirectory(), TopicName.parse(f"topic://closing-{unique}/ns/loose")

    directory.mark_closing(host)  # as a host deciding whether to exit ...
    lifted = threading.Timer(2.0, directory.unmark_closing, (host,))
    lifted.start()  # ... and staying
    started = time.monotonic()
    handle = start_segment_actor(loose.segment(0, 0, 0x7FFF), initialize=True)
    assert time.monotonic() - started >= 1.5, "the starter did not wait for the decision"
    assert handle.host._actor_id == lookup(host)._actor_id, "the host that stayed"
    assert ray.get(handle.stats.remote(credential=guard().internal_token()))["records"] == 0

    directory.mark_closing(host)  # as a host deciding to exit ...
    pid = pid_of(host)
    ray.kill(lookup(host), no_restart=True)  # ... and exiting
    handle = start_segment_actor(loose.segment(1, 0x8000, 0xFFFF), initialize=True)
    assert not directory.closing(host), "the starter lifted the mark of the host that exited"
    assert pid_of(host) != pid, "opened in a new host"
    assert ray.get(handle.stats.remote(credential=guard().internal_token()))["records"] == 0
    for segment in (loose.segment(0, 0, 0x7FFF), loose.segment(1, 0x8000, 0xFFFF)):
        stop_serving(segment)
    admin.delete_scalable_topic(stays)


def wait_until(condition, timeout_s: float, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout_s} s for {what}"
        time.sleep(0.2)


def pid_of(actor: str) -> int:
    return ray.get(lookup(actor).__ray_call__.remote(lambda self: os.getpid()))


def test_a_name_deleted_and_created_anew_is_watched_as_the_new_topic(admin, unique):
    """The DAG watch server read the name as deleted; created again at once, a client
    that read the new layout and listens for changes is not told it was deleted."""
    topic = f"topic://recov/ns/ident-watched-{unique}"
    admin.create_scalable_topic(topic, 1)
    server = dag_watch_actor()
    old_epoch = ray.get(server.listen.remote(topic, None, 0.1))["epoch"]  # now watched
    admin.delete_scalable_topic(topic)
    with pytest.raises(TopicNotFoundError):
        ray.get(server.listen.remote(topic, old_epoch, 5))
    admin.create_scalable_topic(topic, 1)
    epoch = admin.get_layout(topic).epoch
    assert ray.get(server.listen.remote(topic, epoch, 0.2)) is None  # nothing newer yet
    admin.delete_scalable_topic(topic)


def test_a_topic_whose_metadata_was_lost_is_not_adopted_by_a_new_one(admin, unique):
    topic = f"topic://recov/ns/ident-lost-{unique}"
    lost = written(admin, topic, rounds=10)
    wipe(topic)

    admin.create_scalable_topic(topic, 2)  # its leftover actors are replaced, not reused
    admin.create_subscription(topic, "s")
    fresh = produce(topic, keys=4, rounds=2, start=500)
    consumer = StreamConsumer(topic, "s", "c1")
    assert_once_in_key_order(drain(consumer, len(fresh)), fresh)
    consumer.close()

    mine = [o for o in admin.check_storage()["orphaned"] if o["topic"] == topic]
    assert [o["incarnation"] for o in mine] == [lost]
    assert mine[0]["segments"] == 2 and mine[0]["sizeBytes"] > 0 and mine[0]["lastWriteMs"]
    with pytest.raises(TopicAlreadyExistsError):
        admin.recover_topic(topic, lost)  # the name is live again: nothing to recover into
    report = admin.check_storage(delete=True)
    assert lost in {o["incarnation"] for o in report["deleted"]}
    assert not [o for o in admin.check_storage()["orphaned"] if o["topic"] == topic]
    assert admin.get_stats(topic)["records"] == len(fresh), "live storage is never deleted"
    admin.delete_scalable_topic(topic)


def test_lost_metadata_is_recovered_from_storage(admin, unique, cli_env):  # noqa: F811
    topic = f"topic://recov/ns/t-{unique}"
    admin.create_scalable_topic(topic, 2, {"team": "billing"})
    admin.create_subscription(topic, "s")
    admin.create_subscription(topic, "t", session_grace_s=5.0)
    admin.set_policy(topic, {"retention": {"timeS": 86_400}})
    sent = produce(topic, keys=16, rounds=10)
    admin.split_segment(topic, 0)  # 2 and 3
    sent += produce(topic, keys=16, rounds=10, start=10)
    admin.merge_segments(topic, 3, 1)  # 4
    sent += produce(topic, keys=16, rounds=10, start=20)
    before = admin.get_layout(topic)

    consumer = StreamConsumer(topic, "s", "c1")
    early = take(consumer, 200)  # part of it, acknowledged
    consumer.close()
    acked_before = admin.get_stats(topic)["subscriptions"]["s"]["backlog"]

    wipe(topic)
    assert topic not in admin.list_scalable_topics("recov/ns")
    (orphan,) = [o for o in admin.check_storage()["orphaned"] if o["topic"] == topic]
    assert orphan["segments"] == 5 and "metadata was lost" in orphan["reason"]

    listed = raytopics(cli_env, "storage", "check")
    assert "orphaned" in listed and orphan["incarnation"] in listed and topic in listed
    out = raytopics(cli_env, "recover", topic)
    assert "recovered" in out and orphan["incarnation"] in out

    layout = admin.get_layout(topic)
    assert dict(layout.all_segments) == dict(before.all_segments)
    assert layout.epoch > before.epoch and dict(layout.properties) == {"team": "billing"}
    assert admin.get_policy(topic)["retention"]["timeS"] == 86_400
    assert admin.list_subscriptions(topic) == ["s", "t"]
    assert admin.get_stats(topic)["subscriptions"]["s"]["backlog"] == acked_before

    consumer = StreamConsumer(topic, "s", "c1")
    rest = drain(consumer, len(sent) - len(early))
    consumer.close()
    delivered = set(early)
    assert not delivered & set(rest), "an acknowledged message came again"
    assert_once_in_key_order(rest, sorted(set(sent) - delivered))
    everything = StreamConsumer(topic, "t", "t1")
    assert_once_in_key_order(drain(everything, len(sent)), sent)
    everything.close()

    admin.split_segment(topic, 4)  # the recovered topic is fully operational
    assert admin.get_layout(topic).active_segments.keys() == {2, 5, 6}
    admin.delete_scalable_topic(topic)


def test_recover_refuses_bad_requests_and_changes_nothing(admin, unique, kv_snapshot):
    topic = f"topic://recov/bad/t-{unique}"
    admin.create_scalable_topic(topic, 1)
    first = admin.get_stats(topic)["incarnation"]
    before = kv_snapshot()
    with pytest.raises(TopicAlreadyExistsError, match="live metadata"):
        admin.recover_topic(topic)
    with pytest.raises(InvalidArgumentError, match="invalid incarnation"):
        admin.recover_topic(topic, "../../etc")
    assert kv_snapshot() == before

    wipe(topic)
    admin.create_scalable_topic(topic, 1)
    second = admin.get_stats(topic)["incarnation"]
    wipe(topic)
    ray.kill(controller_actor(TopicName.parse(topic)).host, no_restart=True)
    time.sleep(1)
    before = kv_snapshot()
    with pytest.raises(AmbiguousStorageError) as raised:
        admin.recover_topic(topic)
    assert sorted(raised.value.incarnations) == sorted([first, second])
    with pytest.raises(StorageNotFoundError):
        admin.recover_topic(topic, "20000101T000000Z-00000000")
    with pytest.raises(StorageNotFoundError):
        admin.recover_topic(f"topic://recov/bad/never-{unique}")
    assert kv_snapshot() == before, "a refused recovery writes nothing"
    names = {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)}
    assert controller_host_name(TopicName.parse(topic)) not in names, "nor starts a controller"

    done = admin.recover_topic(topic, first)
    assert done["incarnation"] == first and admin.get_stats(topic)["incarnation"] == first
    admin.delete_scalable_topic(topic)
    assert [o["incarnation"] for o in admin.check_storage()["orphaned"] if o["topic"] == topic] == [
        second
    ]
    admin.check_storage(delete=True)


def test_storage_check_and_recover_over_rest(admin, unique):
    from actors.gateway.server import start_gateway, stop_gateway

    topic = f"topic://recov/ns/rest-{unique}"
    admin.create_scalable_topic(topic, 1)
    incarnation = admin.get_stats(topic)["incarnation"]
    wipe(topic)
    port = free_port()
    url = start_gateway(port)
    try:
        with AdminHttpClient(url) as client:
            report = client.check_storage()
            assert incarnation in {o["incarnation"] for o in report["orphaned"]}
            path = f"/admin/v2/scalable/recov/ns/rest-{unique}/recover"
            status, body = http(url, "POST", path, {"incarnation": "nope"})
            assert status == 400 and body["error"] == "invalid_argument"
            key = {"Idempotency-Key": f"recover-{unique}"}
            status, done = http(url, "POST", path, headers=key)
            assert status == 200 and done["incarnation"] == incarnation, done
            # the same rebuild sent again (its answer lost) is answered as it was
            assert http(url, "POST", path, headers=key) == (200, done)
            status, body = http(url, "POST", path)
            assert status == 409 and body["error"] == "topic_exists"
            with pytest.raises(TopicAlreadyExistsError):  # the client's own fresh id
                client.recover_topic(topic)
    finally:
        stop_gateway(port)
    admin.delete_scalable_topic(topic)
