"""Which object stores a topic may tier to, when a sealed segment moves there, and how
long to wait after a move failed (an object store that is down is retried, ever more
slowly, never given up on: the local copy keeps serving meanwhile). Pure:
``actors.control.tiering`` and the controller act on it.

A tier URI makes the cluster write where it points, with the cluster's own
credentials, so a topic's admin may not choose just any: the operator lists the
allowed URI prefixes in ``RAYTOPICS_TIER_URIS``, and tiering is off without it. A
policy names only a location under one of them; how the cluster reaches it (an
endpoint, credentials, any other ``pyarrow.fs`` option) comes from the operator's
prefix alone, since a policy's option could send the data elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from runtime.errors import TierRefusedError
from runtime.layout import SegmentLayout
from runtime.uris import redacted

TIER_URIS_ENV = "RAYTOPICS_TIER_URIS"
FIRST_RETRY_S = 5.0
MAX_RETRY_S = 300.0


@dataclass(frozen=True)
class _Location:
    """A tier URI taken apart: where (scheme, host or bucket, path segments) and how
    (credentials, query parameters)."""

    scheme: str
    host: str
    segments: tuple[str, ...]
    userinfo: str
    query: str

    @classmethod
    def parse(cls, uri: str) -> _Location:
        parts = urlsplit(uri.strip())
        userinfo, _, host = parts.netloc.rpartition("@")
        segments = tuple(segment for segment in parts.path.split("/") if segment)
        for segment in segments:
            plain = unquote(segment)
            if plain in (".", "..") or "/" in plain or "\\" in plain:
                raise TierRefusedError(
                    f"tiering.uri {redacted(uri)!r} must not contain '.', '..' or an encoded "
                    f"separator in its path"
                )
        return cls(parts.scheme.lower(), host.lower(), segments, userinfo, parts.query)

    def holds(self, other: _Location) -> bool:
        """Whether ``other`` lies at or under this prefix, by whole path segments."""
        same_store = (self.scheme, self.host) == (other.scheme, other.host)
        return same_store and other.segments[: len(self.segments)] == self.segments

    def uri(self) -> str:
        netloc = f"{self.userinfo}@{self.host}" if self.userinfo else self.host
        query = f"?{self.query}" if self.query else ""
        return f"{self.scheme}://{netloc}/{'/'.join(self.segments)}{query}"


def allowed_prefixes(allowed: str | None) -> list[str]:
    """The operator's tier prefixes (``RAYTOPICS_TIER_URIS``, comma-separated)."""
    return [prefix.strip() for prefix in (allowed or "").split(",") if prefix.strip()]


def resolve(uri: str, allowed: str | None) -> str:
    """The URI the cluster writes a topic's tier to: the policy's ``uri`` (a location:
    scheme, bucket or host, path), with the options and credentials of the operator's
    longest allowed prefix (``RAYTOPICS_TIER_URIS``) that holds it by whole path
    segments (``s3://bucket/topics`` holds ``s3://bucket/topics/x``, not
    ``s3://bucket/topics-other``).

    ``TierRefusedError`` when tiering is off, when the location lies outside every
    prefix, and when the policy's URI carries query parameters, credentials or a
    fragment: what changes where or how the cluster writes (``endpoint_override``,
    keys, ``scheme``…) is the operator's, written in the prefix, never a policy's."""
    prefixes = allowed_prefixes(allowed)
    if not prefixes:
        raise TierRefusedError(
            f"tiering is off on this cluster: its operator lists the object stores topics may "
            f"use in {TIER_URIS_ENV} (comma-separated URI prefixes, e.g. s3://bucket/topics/)"
        )
    parts = urlsplit(uri.strip())
    if parts.query or parts.fragment or "@" in parts.netloc:
        raise TierRefusedError(
            f"tiering.uri {redacted(uri)!r} may name only a location (scheme, bucket, path): "
            f"endpoints, credentials and other options of a tier are the operator's, "
            f"set with the allowed prefix in {TIER_URIS_ENV}"
        )
    wanted = _Location.parse(uri)
    holders = [p for p in map(_Location.parse, prefixes) if p.holds(wanted)]
    if not holders:
        shown = ", ".join(redacted(prefix) for prefix in prefixes)
        raise TierRefusedError(
            f"tiering.uri {redacted(uri)!r} is outside the tiers this cluster allows: "
            f"{shown} ({TIER_URIS_ENV})"
        )
    chosen = max(holders, key=lambda prefix: len(prefix.segments))  # first of the longest
    return _Location(
        wanted.scheme, wanted.host, wanted.segments, chosen.userinfo, chosen.query
    ).uri()


def due_for_tier(
    layout: SegmentLayout, stats: Mapping[int, Mapping[str, Any]], after_s: float, now_ms: int
) -> list[int]:
    """Sealed segments of ``layout`` still on local disk whose seal is at least ``after_s``
    old, by their own stats (a segment that did not answer is not due), and whose
    transactions are all decided (a reader may still get what an undecided one holds)."""
    due = []
    for segment_id, info in sorted(layout.all_segments.items()):
        st = stats.get(segment_id)
        if info.is_active or st is None or st.get("tiered") or not st.get("terminated"):
            continue
        if st.get("stableEnd", st.get("endOffset")) != st.get("endOffset"):
            continue
        sealed_at = st.get("sealedAtMs")
        if sealed_at is not None and now_ms - sealed_at >= after_s * 1000:
            due.append(segment_id)
    return due


def retry_delay_s(failures: int) -> float:
    """The wait before the next attempt after ``failures`` failed ones in a row."""
    return min(FIRST_RETRY_S * 2 ** max(failures - 1, 0), MAX_RETRY_S)
