"""Plumbing the Ray clients share: joining the cluster, keeping the GC out of delivery."""

from __future__ import annotations

import gc
import os
from typing import TYPE_CHECKING

import ray

from runtime.config import GC_FREEZE_ENV
from runtime.connect import connect
from runtime.errors import SegmentNotFoundError

if TYPE_CHECKING:
    from clients._producer_core import SegmentAccess


def joined(address: str | None = None) -> None:
    """Make this process a Ray driver if it is not one yet, as ``ScalableTopicsAdmin``
    does: ``address``, else ``RAY_ADDRESS``, else a cluster started on this machine
    with ``ray start``, else the embedded Ray (``runtime.connect.connect``). Every
    client calls it first, so two lines (an import and ``Producer(topic).send(...)``)
    are a whole program. In a Ray task or actor, or after the application's own
    ``ray.init``, the process is connected already and nothing changes."""
    if not ray.is_initialized():
        connect(address)


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


def segment_access(credential: str | None) -> SegmentAccess:
    """How a Ray driver's producer reaches segments: through their actors, looked up by
    name; while an actor restarts or is not registered yet, sends wait and retry."""
    from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

    from actors.segment.lookup import find_segment_actor
    from clients._producer_core import SegmentAccess

    return SegmentAccess(
        find=lambda name: find_segment_actor(name, credential=credential),
        unavailable=(SegmentNotFoundError, ActorUnavailableError, ActorDiedError, RayActorError),
    )
