"""Where each part of an idempotent streaming write goes: which records, which segment,
which producer sequence (the pure half of ``actors.admin.stream_writes``).

A part is an explicit hash range, not "whatever its segment owns": when a segment is
sealed before its part was stored, the part's records go to the segments that own
its range now, and after a merge that owner's range also covers records of parts
that were stored already. Carving the part's own range by each owner keeps every
record in exactly one part, whatever the layout did in between.

Several parts can land on one segment (two sealed parents rerouted to their merged
child); each gets its own sequence, above any this write holds there, and they are
appended in sequence order, since a segment refuses a sequence below one it stored.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from runtime.layout import HashRange, SegmentLayout
from runtime.names import MAX_HASH

# NumPy only where rows are picked: the catalog, and with it every controller and
# coordinator process, parses sink writes and never picks rows.
if TYPE_CHECKING:
    import numpy as np


class SinkPart(BaseModel):
    """The records of one write whose hash is in ``hash_range``, appended to
    ``segment`` under this write's producer id and ``sequence``."""

    model_config = ConfigDict(frozen=True)

    segment: int
    sequence: int
    hash_range: HashRange

    def rows(self, hashes: np.ndarray) -> np.ndarray:
        """Positions of this part's records among the write's routing ``hashes``."""
        import numpy as np

        span = self.hash_range
        return np.flatnonzero((hashes >= span.start) & (hashes <= span.end))


Piece = tuple[int, HashRange]  # (owning segment, the part of a range it owns)

WHOLE = HashRange(start=0, end=MAX_HASH)


def owned_pieces(layout: SegmentLayout, hashes: np.ndarray, span: HashRange = WHOLE) -> list[Piece]:
    """Each active segment that owns some record hashed inside ``span``, with the
    intersection of its range and ``span``; a segment owning none of them gets nothing."""
    inside = hashes[(hashes >= span.start) & (hashes <= span.end)]
    pieces: list[Piece] = []
    for segment_id, info in sorted(layout.active_segments.items()):
        start, end = max(span.start, info.hash_range.start), min(span.end, info.hash_range.end)
        if start <= end and ((inside >= start) & (inside <= end)).any():
            pieces.append((segment_id, HashRange(start=start, end=end)))
    return pieces


def with_sequences(
    pieces: Iterable[Piece], lasts: Mapping[int, int], held: Sequence[SinkPart] = ()
) -> list[SinkPart]:
    """Parts for ``pieces``: on each segment, the sequences after both the segment's last
    stored one (``lasts``) and every sequence this write already ``held`` there."""
    following = {s: last + 1 for s, last in lasts.items()}
    for part in held:
        following[part.segment] = max(following.get(part.segment, 0), part.sequence + 1)
    parts = []
    for segment_id, span in pieces:
        parts.append(SinkPart(segment=segment_id, sequence=following[segment_id], hash_range=span))
        following[segment_id] += 1
    return parts


def in_append_order(parts: Iterable[SinkPart]) -> list[SinkPart]:
    """Parts in the order they may be appended: per segment, by sequence."""
    return sorted(parts, key=lambda part: (part.segment, part.sequence))


class SinkWrite(BaseModel):
    """One idempotent write's progress (``runtime.sink_writes``) as the cluster records it:
    the batch it belongs to, and its parts: which records each append carries, to which
    segment, under which sequence."""

    model_config = ConfigDict(frozen=True)

    batch: int
    parts: tuple[SinkPart, ...]
    done: bool = False

    def to_bytes(self) -> bytes:
        return self.model_dump_json().encode()
