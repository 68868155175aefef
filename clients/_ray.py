"""Plumbing every client shares: a private event loop for sync calls, error unwrapping."""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

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


def with_sync_twins(cls: type[T]) -> type[T]:
    """Give every ``name_async`` coroutine method a blocking ``name`` twin."""
    for attribute, method in list(vars(cls).items()):
        if attribute.endswith("_async") and inspect.iscoroutinefunction(method):
            setattr(cls, attribute.removesuffix("_async"), sync_twin(method))
    return cls


def sync_twin(method: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, T]:
    """The blocking version of an ``*_async`` method."""

    @functools.wraps(method)
    def blocking(*args: P.args, **kwargs: P.kwargs) -> T:
        return background_loop().run(method(*args, **kwargs))

    blocking.__name__ = method.__name__.removesuffix("_async")
    blocking.__doc__ = method.__doc__
    return blocking
