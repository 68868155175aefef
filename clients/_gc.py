"""Keeping the cyclic garbage collector out of delivery, in every client (with Ray or
without)."""

from __future__ import annotations

import gc
import os

from runtime.config import GC_FREEZE_ENV


def freeze_what_exists() -> None:
    """Take every object alive once a client has started (the ~130k that importing Ray
    and pyarrow and starting the client leave behind) out of the cyclic GC's full
    collections. Clients call it when they have started.

    A consumer makes tens of thousands of messages a second, enough of them live
    through two young collections to set off a full one every second or so, and a
    full collection walks every tracked object, during which nothing is delivered
    (it set the p99 of bench/end_to_end.py's half load: bench/README.md).
    Frozen objects are still freed by reference counting; only cycles among them
    would never be collected. ``RAYTOPICS_GC_FREEZE=0`` leaves the GC alone.
    """
    if os.environ.get(GC_FREEZE_ENV, "1") != "0":
        gc.freeze()
