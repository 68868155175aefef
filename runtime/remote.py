"""Calling actors: our typed errors come back as themselves, not wrapped by Ray."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, TypeVar

import ray
from ray.exceptions import ActorUnschedulableError, RayActorError, RayTaskError

from runtime.errors import ScalableTopicsError

T = TypeVar("T")

# What a call to an actor raises while the actor is away: restarting or dead
# (``RayActorError``), or pinned to a node that is gone (a segment's host on its disk's
# node: ``ActorUnschedulableError``, which is not a ``RayActorError``). A caller that
# looks the actor up again may find it elsewhere (a replicated segment's new leader).
ACTOR_GONE = (RayActorError, ActorUnschedulableError)


async def call(awaitable: Awaitable[T]) -> T:
    """Await a Ray call, re-raising our own typed errors without Ray's wrapper."""
    try:
        return await awaitable
    except RayTaskError as err:
        if isinstance(err.cause, ScalableTopicsError):
            raise err.cause from None
        raise


def get(ref: ray.ObjectRef) -> Any:
    """``ray.get`` for a synchronous caller, re-raising our typed errors as ``call`` does."""
    try:
        return ray.get(ref)
    except RayTaskError as err:
        if isinstance(err.cause, ScalableTopicsError):
            raise err.cause from None
        raise
