import pytest

from runtime.errors import InvalidNameError
from runtime.names import SegmentName, TopicName, parse_namespace
from runtime.segment_hosts import controller_host_name, coordinator_host_name


def test_topic_round_trip_and_actor_names():
    t = TopicName.parse("topic://acme/orders/events")
    assert str(t) == "topic://acme/orders/events"
    assert t.namespace_path == "acme/orders"
    assert controller_host_name(t) == "controllers:acme/orders"
    assert controller_host_name(t, {}) == "controllers:acme/orders"
    tagged = controller_host_name(t, {"RAYTOPICS_TLS_CERT": "/etc/cert.pem"})
    assert tagged.startswith("controllers:acme/orders/with-") and "cert" not in tagged
    assert coordinator_host_name(t) == "coordinators:acme/orders"


def test_segment_round_trip():
    s = SegmentName.parse("segment://acme/orders/events/0000-7fff-1")
    assert (s.segment_id, s.start, s.end) == (1, 0, 0x7FFF)
    assert str(s) == "segment://acme/orders/events/0000-7fff-1"
    assert s.actor_name == "segment:acme/orders/events/0000-7fff-1"
    assert TopicName.parse("topic://a/b/c").segment(12, 0x8000, 0xFFFF).descriptor == "8000-ffff-12"


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "acme/orders/events",
        "topic://acme/orders",
        "topic://acme/orders/events/x",
        "topic://acme//events",
        "topic://ac me/o/e",
        "topic://a/b/c#",
        "persistent://a/b/c",
        "topic://-a/b/c",
        "topic://a/b/" + "x" * 200,
        None,
        42,
    ],
)
def test_malformed_topic_names_are_rejected(bad):
    with pytest.raises(InvalidNameError) as err:
        TopicName.parse(bad)
    assert "topic" in str(err.value)


@pytest.mark.parametrize(
    "bad",
    [
        "segment://a/b/c",
        "segment://a/b/c/0000-7fff",
        "segment://a/b/c/0000-7FFF-1",
        "segment://a/b/c/8000-7fff-1",
        "segment://a/b/c/0000-7fff-01",
        "segment://a/b/c/00000-7fff-1",
        "topic://a/b/c/0000-7fff-1",
    ],
)
def test_malformed_segment_names_are_rejected(bad):
    with pytest.raises(InvalidNameError):
        SegmentName.parse(bad)


def test_parse_namespace():
    assert parse_namespace("acme/orders") == ("acme", "orders")
    for bad in ("acme", "acme/orders/x", "acme/-x", 7):
        with pytest.raises(InvalidNameError):
            parse_namespace(bad)
