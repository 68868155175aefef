"""Subscription settings shared by the admin API, the REST gateway and the catalog.

The record itself (``SubscriptionMetadata``) is kept by ``storage.catalog``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from runtime.errors import InvalidArgumentError

StartPosition = Literal["earliest", "latest"]
DEFAULT_GRACE_S = 60.0

# Where ``reset_subscription`` moves a subscription: its first or next offset in every
# segment, or the first message published at or after a time (epoch milliseconds).
ResetTarget = StartPosition | int
# The earliest publish time a reset may name: 2000-01-01, so that seconds passed as
# milliseconds (a common slip) are refused rather than read as 1970.
_EARLIEST_TIME_MS = 946_684_800_000


def reset_target(to: object) -> ResetTarget:
    """``to`` checked: ``"earliest"``, ``"latest"``, or a publish time in epoch
    milliseconds (a ``datetime`` is converted by the clients). ``InvalidArgumentError``
    naming what is allowed otherwise."""
    if to in ("earliest", "latest"):
        return to  # type: ignore[return-value]
    if isinstance(to, int) and not isinstance(to, bool) and to >= _EARLIEST_TIME_MS:
        return to
    raise InvalidArgumentError(
        f"a subscription resets to 'earliest', 'latest' or a publish time in epoch "
        f"milliseconds (from 2000 on, e.g. 1764000000000), not {to!r}"
    )


# What a client may pass: a ``datetime`` too, turned into epoch milliseconds.
ResetTo = StartPosition | int | datetime


def reset_ms(to: ResetTo) -> ResetTarget:
    """``to`` as sent to the cluster: a ``datetime`` (timezone-aware; a naive one is
    refused, it names no moment) in epoch milliseconds, anything else as given (the
    cluster checks it)."""
    if isinstance(to, datetime):
        if to.tzinfo is None:
            raise InvalidArgumentError(
                f"{to!r} has no timezone: pass an aware datetime "
                "(datetime.now(timezone.utc)) or epoch milliseconds"
            )
        return int(to.timestamp() * 1000)
    return to


def time_ms(when: ResetTo) -> int:
    """A moment as epoch milliseconds: an aware ``datetime``, or milliseconds checked as
    ``reset_target`` checks them."""
    moment = reset_target(reset_ms(when))
    if isinstance(moment, str):
        raise InvalidArgumentError(f"a time is needed here, not {moment!r}")
    return moment
