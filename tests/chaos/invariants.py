"""The chaos suite's invariant checker: pure functions over what was acked and delivered.

Messages carry ``(key, seq)`` with ``seq`` increasing per key in send order, so
completeness, duplicates and per-key order can all be checked from the values.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable


def delivery_violations(
    acked: Iterable[tuple[str, int]],
    delivered: Iterable[tuple[str, int]],
    *,
    exactly_once: bool,
    ordered: bool = True,
) -> list[str]:
    """Every acked send delivered; no duplicates when ``exactly_once``; per-key order.

    Order is judged on first deliveries: a redelivery (allowed at least once)
    repeats an earlier message, it does not reorder new ones.
    """
    problems: list[str] = []
    seen: dict[tuple[str, int], int] = defaultdict(int)
    last_new: dict[str, int] = {}
    for key, seq in delivered:
        seen[(key, seq)] += 1
        if seen[(key, seq)] > 1:
            if exactly_once:
                problems.append(f"duplicate delivery of {key}#{seq}")
            continue
        if ordered and seq < last_new.get(key, -1):
            problems.append(f"key {key}: #{seq} delivered after #{last_new[key]}")
        last_new[key] = max(seq, last_new.get(key, -1))
    missing = sorted(m for m in set(acked) if m not in seen)
    if missing:
        problems.append(f"{len(missing)} acked messages never delivered, e.g. {missing[:5]}")
    return problems


def segment_state_violations(states: dict[int, tuple[str, bool]]) -> list[str]:
    """``states``: segment id -> (layout state, terminated at the segment).

    A SEALED segment must refuse writes (else it would be writable beside its
    children); an ACTIVE one must accept them.
    """
    return [
        f"segment {sid} is {state} in the layout but terminated={terminated} at the segment"
        for sid, (state, terminated) in sorted(states.items())
        if (state == "SEALED") != terminated
    ]
