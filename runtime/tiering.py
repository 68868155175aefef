"""Which object stores a topic may tier to, when a sealed segment moves there, and how
long to wait after a move failed (an object store that is down is retried, ever more
slowly, never given up on: the local copy keeps serving meanwhile). Pure:
``actors.tiering`` and the controller act on it.

A tier URI makes the cluster write where it points, with the cluster's own
credentials, so a topic's admin may not choose just any: the operator lists the
allowed URI prefixes in ``RAYTOPICS_TIER_URIS``, and tiering is off without it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from runtime.errors import TierRefusedError
from runtime.layout import SegmentLayout
from runtime.uris import redacted

TIER_URIS_ENV = "RAYTOPICS_TIER_URIS"
FIRST_RETRY_S = 5.0
MAX_RETRY_S = 300.0


def check_allowed(uri: str, allowed: str | None) -> None:
    """Refuse (``TierRefusedError``) a tier ``uri`` outside the operator's ``allowed``
    prefixes (``RAYTOPICS_TIER_URIS``, comma-separated), or any at all without them."""
    prefixes = [prefix.strip() for prefix in (allowed or "").split(",") if prefix.strip()]
    if not prefixes:
        raise TierRefusedError(
            f"tiering is off on this cluster: its operator lists the object stores topics may "
            f"use in {TIER_URIS_ENV} (comma-separated URI prefixes, e.g. s3://bucket/topics/)"
        )
    parts = urlsplit(uri)
    if ".." in parts.path.split("/"):
        raise TierRefusedError(f"tiering.uri {redacted(uri)!r} must not contain '..'")
    plain = f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}{parts.path}"
    if not any(plain.startswith(prefix) for prefix in prefixes):
        raise TierRefusedError(
            f"tiering.uri {redacted(uri)!r} is outside the tiers this cluster allows: "
            f"{', '.join(prefixes)} ({TIER_URIS_ENV})"
        )


def due_for_tier(
    layout: SegmentLayout, stats: Mapping[int, Mapping[str, Any]], after_s: float, now_ms: int
) -> list[int]:
    """Sealed segments of ``layout`` still on local disk whose seal is at least ``after_s``
    old, by their own stats (a segment that did not answer is not due)."""
    due = []
    for segment_id, info in sorted(layout.all_segments.items()):
        st = stats.get(segment_id)
        if info.is_active or st is None or st.get("tiered") or not st.get("terminated"):
            continue
        sealed_at = st.get("sealedAtMs")
        if sealed_at is not None and now_ms - sealed_at >= after_s * 1000:
            due.append(segment_id)
    return due


def retry_delay_s(failures: int) -> float:
    """The wait before the next attempt after ``failures`` failed ones in a row."""
    return min(FIRST_RETRY_S * 2 ** max(failures - 1, 0), MAX_RETRY_S)
