"""The segment directory and host naming, as pure logic over an in-memory KV."""

from __future__ import annotations

from dataclasses import replace

import pytest

from actors.controller_directory import ControllerDirectory, ControllerEntry
from actors.segment.directory import Entry, SegmentDirectory
from runtime.errors import InvalidArgumentError
from runtime.names import TopicName
from runtime.segment_hosts import (
    HOSTS_ENV,
    controller_host_name,
    host_name,
    host_prefix,
    hosts_per_namespace,
)
from storage.metadata import MemoryKeyValue

TOPIC = TopicName("t", "ns", "orders")
OTHER = TopicName("t", "ns", "orders2")  # shares a prefix with TOPIC's name


def entry(host: str, node: str = "n1") -> Entry:
    return Entry(host, node, "/data", {"policy": "fsync", "interval_s": 0.2}, "inc-1")


def test_an_entry_round_trips_and_only_its_host_removes_it() -> None:
    directory = SegmentDirectory(MemoryKeyValue())
    segment = TOPIC.segment(3, 0, 0x7FFF)
    assert directory.get(segment) is None
    directory.put(segment, entry("h1"))
    assert directory.get(segment) == entry("h1")
    directory.put(segment, entry("h2"))  # opened in another host (woken elsewhere)
    directory.remove(segment, "h1")  # the old host's late close leaves the newer entry
    assert directory.get(segment) == entry("h2")
    directory.remove(segment, "h2")
    assert directory.get(segment) is None


def test_a_close_issued_before_a_segment_was_entered_again_leaves_the_new_entry() -> None:
    """A topic deleted and created again repeats its segments' names: a close of the old
    segment that reaches the host after the new one was entered (Ray retries a call across
    a host's restart; a hibernation's close is not waited for) must not remove it."""
    directory = SegmentDirectory(MemoryKeyValue())
    segment = TOPIC.segment(0, 0, 0xFFFF)
    old = Entry("h1", "n1", "/data", {}, "inc-1", entered_at=100)
    new = Entry("h1", "n1", "/data", {}, "inc-2", entered_at=300)
    directory.put(segment, old)
    directory.put(segment, new)  # started again, not opened by h1 yet
    directory.remove(segment, "h1", issued_at=200)  # the old incarnation's close
    assert directory.get(segment) == new
    directory.remove(segment, "h1", issued_at=300)  # one issued after it was entered
    assert directory.get(segment) is None
    directory.put(segment, new)
    directory.remove(segment, "h1")  # a removal that is not a timed close
    assert directory.get(segment) is None


def test_a_topic_s_entries_are_its_own() -> None:
    directory = SegmentDirectory(MemoryKeyValue())
    mine = [TOPIC.segment(i, 0, 0xFFFF) for i in range(3)]
    theirs = OTHER.segment(0, 0, 0xFFFF)
    for segment in mine:
        directory.put(segment, entry("h1"))
    directory.put(theirs, entry("h2", node="n2"))
    assert set(directory.of_topic(TOPIC)) == {s.actor_name for s in mine}
    assert directory.per_node({"h1", "h2"}) == {"n1": 3, "n2": 1}
    assert directory.per_node({"h2"}) == {"n2": 1}, "a dead host's segments count nowhere"
    failed = Entry("h2", "n2", "/data", {}, "inc-1", failed="its storage is gone")
    directory.put(theirs, failed)
    assert directory.per_node({"h1", "h2"}) == {"n1": 3}, "nor does one its host cannot open"
    assert not failed.serves({"h2"}) and entry("h1").serves({"h1"})
    directory.remove_topic(TOPIC)
    assert directory.of_topic(TOPIC) == {} and directory.get(theirs) is not None


def test_a_followers_entry_is_its_hosts_and_never_where_clients_are_sent() -> None:
    """A replicated segment's leader has the segment's entry; each follower one of its own,
    by host, which its host reopens it from and which counts on its node."""
    directory = SegmentDirectory(MemoryKeyValue())
    segment = TOPIC.segment(0, 0, 0xFFFF)
    leader = entry("h1", "n1")
    followers = [replace(entry(h, n), replica=True) for h, n in (("h2", "n2"), ("h3", "n3"))]
    for placed in (leader, *followers):
        directory.put(segment, placed)
    assert directory.get(segment) == leader
    assert directory.get_replica(segment, "h2") == followers[0]
    assert directory.get_replica(segment, "h1") is None
    assert set(directory.of_topic(TOPIC)) == {segment.actor_name}  # what clients look up
    assert directory.per_node({"h1", "h2", "h3"}) == {"n1": 1, "n2": 1, "n3": 1}
    assert directory.names_host("t/ns", "h3")
    directory.promote(segment, "h3", at=500)  # h3's follower elected: clients go there
    assert directory.get(segment) == replace(followers[1], replica=False, entered_at=500)
    assert directory.get_replica(segment, "h3") is None
    assert directory.get_replica(segment, "h1") == replace(leader, replica=True)
    directory.promote(segment, "h1", at=600)  # and back
    assert directory.get(segment).host == "h1" and directory.get_replica(segment, "h3")
    directory.remove(segment, "h2")  # its host closed it: the others stay
    assert directory.get_replica(segment, "h2") is None and directory.get(segment).host == "h1"
    assert directory.get_replica(segment, "h3").host == "h3"
    directory.remove_topic(TOPIC)
    assert directory.get_replica(segment, "h3") is None and directory.get(segment) is None


def test_host_names_follow_the_namespace_and_the_node_or_the_segment_id(monkeypatch) -> None:
    segment = TOPIC.segment(5, 0, 0xFFFF)
    assert host_name(segment, None, 1) == "segment-host:t/ns/0"
    assert host_name(OTHER.segment(0, 0, 1), None, 1) == "segment-host:t/ns/0", "one namespace"
    assert host_name(segment, None, 4) == "segment-host:t/ns/2"  # crc32("t/ns/orders") + 5
    assert host_name(segment, "abc", 4) == "segment-host:t/ns/node-abc"
    # A topic's segments go round the hosts from a slot of the topic's own.
    slots = [host_name(TOPIC.segment(i, 0, 1), None, 4) for i in range(8)]
    assert len(set(slots)) == 4 and slots[:4] == slots[4:]
    firsts = {host_name(TopicName("t", "ns", f"t{i}").segment(0, 0, 1), None, 4) for i in range(20)}
    assert len(firsts) > 1, "the namespace's topics do not all start on one host"
    assert host_name(segment, None, 1).startswith(host_prefix(TOPIC))
    # Topics created with settings of their own share hosts only with topics created alike.
    tls = {"RAYTOPICS_TLS_CERT": "/pki/a.pem", "RAYTOPICS_TLS_KEY": "/pki/a.key"}
    with_tls = host_name(segment, None, 1, tls)
    assert with_tls.startswith(host_prefix(TOPIC)) and with_tls != host_name(segment, None, 1)
    assert with_tls == host_name(OTHER.segment(0, 0, 1), None, 1, dict(reversed(tls.items())))
    assert with_tls != host_name(segment, None, 1, tls | {"RAYTOPICS_TLS_CERT": "/pki/b.pem"})
    assert "/pki" not in with_tls, "a name shows no setting's value"
    elsewhere = TopicName("t", "ns2", "orders").segment(0, 0, 1)  # a namespace sharing a prefix
    assert not host_name(elsewhere, None, 1).startswith(host_prefix(TOPIC))
    monkeypatch.delenv(HOSTS_ENV, raising=False)
    assert hosts_per_namespace() == 1
    monkeypatch.setenv(HOSTS_ENV, "3")
    assert hosts_per_namespace() == 3
    for bad in ("0", "-1", "two"):
        monkeypatch.setenv(HOSTS_ENV, bad)
        with pytest.raises(InvalidArgumentError, match=HOSTS_ENV):
            hosts_per_namespace()


def test_a_controller_entry_round_trips_its_host_lists_it_and_only_it_removes_it() -> None:
    directory = ControllerDirectory(MemoryKeyValue())
    durability = {"policy": "interval", "interval_s": 0.2}
    assert directory.get(TOPIC) is None
    directory.put(TOPIC, ControllerEntry("controllers:t/ns", "/data", durability))
    directory.put(OTHER, ControllerEntry("controllers:t/ns/with-abc", "/data", durability))
    assert directory.get(TOPIC) == ControllerEntry("controllers:t/ns", "/data", durability)
    assert directory.of_host("controllers:t/ns") == {str(TOPIC): directory.get(TOPIC)}
    assert directory.of_host("controllers:t/other") == {}
    directory.remove(TOPIC, "controllers:t/ns/with-abc")  # not its host: kept
    assert directory.get(TOPIC) is not None
    directory.remove(TOPIC, "controllers:t/ns")
    assert directory.get(TOPIC) is None and directory.get(OTHER) is not None


def test_a_namespace_shares_one_controller_host_per_set_of_topic_settings() -> None:
    tls = {"RAYTOPICS_TLS_CERT": "/etc/a.pem", "RAYTOPICS_TLS_KEY": "/etc/a.key"}
    assert controller_host_name(TOPIC) == controller_host_name(OTHER) == "controllers:t/ns"
    assert controller_host_name(TOPIC, {}) == "controllers:t/ns"
    assert controller_host_name(TOPIC, tls) == controller_host_name(OTHER, dict(tls))
    assert controller_host_name(TOPIC, tls) != controller_host_name(TOPIC, {**tls, "x": "y"})
    assert controller_host_name(TopicName("t", "ns2", "orders")) == "controllers:t/ns2"
