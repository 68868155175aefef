"""What a queue consumer does with a message that keeps coming back: wait longer before
each redelivery (``RedeliveryBackoff``), and after a number of deliveries move it to a
dead-letter topic (``DeadLetterPolicy``), as Pulsar's consumer does, so one poison
message is not redelivered forever. Pure: ``clients.queue_consumer`` applies them; the
segments count deliveries (``runtime.dispatch``) and hold nacked messages back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from runtime.errors import InvalidArgumentError
from runtime.names import TopicName


@dataclass(frozen=True)
class RedeliveryBackoff:
    """A negatively acknowledged message comes back after ``initial_s``, then
    ``multiplier`` times longer for each earlier redelivery, never after more than
    ``max_s``."""

    initial_s: float = 1.0
    max_s: float = 60.0
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        for name in ("initial_s", "max_s", "multiplier"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise InvalidArgumentError(f"RedeliveryBackoff.{name} must be > 0, got {value!r}")
        if self.max_s < self.initial_s or self.max_s > 86_400:
            raise InvalidArgumentError(
                f"RedeliveryBackoff.max_s must be between initial_s ({self.initial_s:g}) and "
                f"86400 seconds, got {self.max_s!r}"
            )
        if self.multiplier < 1:
            raise InvalidArgumentError(
                f"RedeliveryBackoff.multiplier must be >= 1, got {self.multiplier!r}"
            )

    def delay_s(self, redelivery_count: int) -> float:
        """The wait before the next delivery of a message delivered
        ``redelivery_count + 1`` times so far."""
        exponent = min(redelivery_count, 64)  # past this, max_s anyway
        return min(self.initial_s * self.multiplier**exponent, self.max_s)


@dataclass(frozen=True)
class DeadLetterPolicy:
    """A message delivered ``max_deliveries`` times without an acknowledgement is, on its
    next delivery, published to ``dead_letter_topic`` (which must exist) with where it
    came from in its properties, and acknowledged."""

    max_deliveries: int
    dead_letter_topic: str

    def __post_init__(self) -> None:
        count = self.max_deliveries
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise InvalidArgumentError(
                f"DeadLetterPolicy.max_deliveries must be an integer >= 1, got {count!r}"
            )
        TopicName.parse(self.dead_letter_topic)  # a clear error for a bad name

    def is_dead(self, redelivery_count: int) -> bool:
        """Whether a message delivered now for the ``redelivery_count + 1``-th time has
        had its ``max_deliveries`` already."""
        return redelivery_count >= self.max_deliveries


def dead_letter_properties(
    properties: dict[str, str],
    topic: str,
    subscription: str,
    segment_id: int,
    offset: int,
    deliveries: int,
    error: str | None,
) -> dict[str, str]:
    """The message's own properties and its origin (``origin.*``: topic, subscription,
    segment, offset, deliveries, and the last error its consumer gave, if any)."""
    origin = {
        "origin.topic": topic,
        "origin.subscription": subscription,
        "origin.segment": str(segment_id),
        "origin.offset": str(offset),
        "origin.deliveries": str(deliveries),
    }
    if error:
        origin["origin.error"] = error[:4096]
    return {**properties, **origin}
