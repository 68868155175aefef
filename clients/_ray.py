"""Plumbing every client shares: a private event loop for sync calls, error unwrapping."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from ray.exceptions import RayTaskError

from runtime.errors import ScalableTopicsError

P = ParamSpec("P")
T = TypeVar("T")


class _LoopThread:
    """One daemon thread running an event loop, so sync APIs can drive async code
    from anywhere (plain scripts, Jupyter, Ray tasks, even inside async actors)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="raytopics-loop", daemon=True).start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()


_loop: _LoopThread | None = None
_loop_lock = threading.Lock()


def background_loop() -> _LoopThread:
    global _loop
    with _loop_lock:
        if _loop is None:
            _loop = _LoopThread()
        return _loop


def sync_twin(method: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, T]:
    """The blocking version of an ``*_async`` method."""

    @functools.wraps(method)
    def blocking(*args: P.args, **kwargs: P.kwargs) -> T:
        return background_loop().run(method(*args, **kwargs))

    blocking.__name__ = method.__name__.removesuffix("_async")
    blocking.__doc__ = method.__doc__
    return blocking


async def call(awaitable: Awaitable[T]) -> T:
    """Await a Ray call, re-raising our own typed errors without Ray's wrapper."""
    try:
        return await awaitable
    except RayTaskError as err:
        if isinstance(err.cause, ScalableTopicsError):
            raise err.cause from None
        raise
