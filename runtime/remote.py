"""Calling actors: our typed errors come back as themselves, not wrapped by Ray."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, TypeVar

import ray
from ray.exceptions import RayTaskError

from runtime.errors import ScalableTopicsError

T = TypeVar("T")


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
