"""Calling actors: our typed errors come back as themselves, not wrapped by Ray."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import ray
from ray.exceptions import ActorUnschedulableError, RayActorError, RayTaskError

from runtime.errors import ScalableTopicsError, UnavailableError

T = TypeVar("T")
REACH_PAUSE_S = 0.5

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


async def reach(what: str, call: Callable[[], Awaitable[T]], wait_s: float = 0.0) -> T:
    """``call()`` of an actor, asked again (each time anew: ``call`` looks the actor up) for
    up to ``wait_s`` while the actor cannot be reached or is unavailable; then
    ``UnavailableError`` (503, a client retries). Unreachable: its process gone, or
    pinned to a node that is."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return await call()
        except UnavailableError:
            if time.monotonic() >= deadline:
                raise
        except ACTOR_GONE as err:
            if time.monotonic() >= deadline:
                raise UnavailableError(
                    f"{what}: its actor cannot be reached now ({type(err).__name__}); retry"
                ) from None
        await asyncio.sleep(REACH_PAUSE_S)
