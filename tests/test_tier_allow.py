"""Which tier URIs a policy may name, and where the cluster then writes
(``runtime.tiering.resolve``): pure logic, no Ray.

A policy names a location under one of the operator's prefixes; everything that
decides where or how the data goes (endpoint, credentials, options) is taken from
the operator's prefix, never from the policy.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.errors import TierRefusedError
from runtime.layout import SegmentLayout
from runtime.tiering import due_for_tier, resolve

S3 = "s3://testing:secret@tier/topics/?endpoint_override=10.0.0.9:9000&scheme=http"
FILE = "file:///srv/tiers/"
ALLOWED = f"{FILE},{S3}"

segment = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_", min_size=1, max_size=12)


def test_a_location_under_a_prefix_takes_the_prefixs_options() -> None:
    assert resolve("s3://tier/topics/orders", ALLOWED) == (
        "s3://testing:secret@tier/topics/orders?endpoint_override=10.0.0.9:9000&scheme=http"
    )
    assert resolve("file:///srv/tiers/a/b/", ALLOWED) == "file:///srv/tiers/a/b"
    assert resolve("file:///srv/tiers", ALLOWED) == "file:///srv/tiers"


@pytest.mark.parametrize(
    "uri",
    [
        "s3://tier/topics/x?endpoint_override=attacker.example:9000",
        "s3://tier/topics/x?scheme=http",
        "s3://key:secret@tier/topics/x",
        "s3://tier/topics/x#frag",
        "file:///srv/tiers/x?anything=1",
    ],
)
def test_options_and_credentials_in_a_policy_are_refused(uri: str) -> None:
    assert_refused(uri, "operator's")


def assert_refused(uri: str, reason: str) -> None:
    """``uri`` is refused for ``reason``, showing no secret: neither the policy's nor the
    operator's."""
    with pytest.raises(TierRefusedError, match=reason) as refused:
        resolve(uri, ALLOWED)
    assert "secret" not in str(refused.value)


@pytest.mark.parametrize(
    "uri",
    [
        "s3://tier/topics-other/x",  # a sibling of the prefix's last segment
        "s3://tier/topic",
        "s3://tier/",
        "s3://other-bucket/topics/x",
        "gs://tier/topics/x",
        "file:///srv/tiers-other/x",
        "file:///etc/raytopics",
        "nosuch://bucket",
    ],
)
def test_locations_outside_every_prefix_are_refused(uri: str) -> None:
    assert_refused(uri, "outside the tiers")


@pytest.mark.parametrize(
    "uri", ["file:///srv/tiers/../etc", "file:///srv/tiers/./x", "s3://tier/topics/%2e%2e/x",
            "s3://tier/topics/a%2Fb"],
)  # fmt: skip
def test_dot_segments_and_encoded_separators_are_refused(uri: str) -> None:
    assert_refused(uri, "must not contain")


def test_prefixes_without_a_trailing_slash_hold_whole_segments() -> None:
    allowed = "s3://bucket/topics?region=eu-west-1"
    assert resolve("s3://bucket/topics/x", allowed) == "s3://bucket/topics/x?region=eu-west-1"
    with pytest.raises(TierRefusedError, match="outside"):
        resolve("s3://bucket/topics-other/x", allowed)


def test_the_longest_prefix_holding_a_location_wins() -> None:
    allowed = "s3://bucket/?endpoint_override=a:1,s3://bucket/special/?endpoint_override=b:2"
    assert resolve("s3://bucket/special/x", allowed).endswith("?endpoint_override=b:2")
    assert resolve("s3://bucket/other/x", allowed).endswith("?endpoint_override=a:1")


def test_without_prefixes_tiering_is_off() -> None:
    for allowed in (None, "", " , "):
        with pytest.raises(TierRefusedError, match="tiering is off"):
            resolve("file:///srv/tiers/x", allowed)


@given(st.lists(segment, min_size=1, max_size=4), st.lists(segment, max_size=4))
def test_any_location_under_a_prefix_is_written_there_with_the_operators_options(
    prefix: list[str], rest: list[str]
) -> None:
    allowed = f"s3://bucket/{'/'.join(prefix)}?endpoint_override=op:9"
    written = resolve(f"s3://bucket/{'/'.join(prefix + rest)}", allowed)
    assert written == f"s3://bucket/{'/'.join(prefix + rest)}?endpoint_override=op:9"


@given(st.lists(segment, min_size=1, max_size=4), segment, st.lists(segment, max_size=3))
def test_no_sibling_of_a_prefix_is_held(prefix: list[str], suffix: str, rest: list[str]) -> None:
    sibling = [*prefix[:-1], prefix[-1] + suffix, *rest]
    with pytest.raises(TierRefusedError, match="outside"):
        resolve(f"s3://bucket/{'/'.join(sibling)}", f"s3://bucket/{'/'.join(prefix)}")


def test_a_sealed_segment_is_due_only_once_its_transactions_are_decided() -> None:
    """``due_for_tier``: a reader may still get what an undecided transaction holds, and
    the tier keeps committed records only, so such a segment waits (not a failed move)."""
    layout = SegmentLayout.initial(2).split_segment(0).split_segment(1)
    sealed = {"terminated": True, "sealedAtMs": 1_000, "endOffset": 10}
    stats = {
        0: {**sealed, "stableEnd": 4},  # a transaction's first record at 4, undecided
        1: {**sealed, "stableEnd": 10},
        2: {"terminated": False, "endOffset": 3, "stableEnd": 3},
    }
    assert due_for_tier(layout, stats, after_s=0, now_ms=2_000) == [1]
    stats[0]["stableEnd"] = 10  # decided
    assert due_for_tier(layout, stats, after_s=0, now_ms=2_000) == [0, 1]
