"""Plumbing every client shares: a private event loop for sync calls, error unwrapping."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import gc
import inspect
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

import ray

from runtime.config import GC_FREEZE_ENV
from runtime.connect import connect

P = ParamSpec("P")
T = TypeVar("T")


class _LoopThread:
    """One daemon thread running an event loop, so sync APIs can drive async code
    from anywhere (plain scripts, Jupyter, Ray tasks, even inside async actors)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="raytopics-loop", daemon=True
        )
        self._thread.start()
        # atexit runs handlers last-in first-out and Ray registered its shutdown when it was
        # imported, so this runs first: a task still awaiting an actor call when the script
        # ends would otherwise touch Ray's core worker after shutdown, which exits with 1.
        atexit.register(self.stop)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self, grace_s: float = 2.0) -> None:
        """Cancel whatever is still running on the loop, then stop its thread."""
        if not self.loop.is_running():
            return
        with contextlib.suppress(TimeoutError):
            asyncio.run_coroutine_threadsafe(_cancel_all(), self.loop).result(grace_s)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(grace_s)


async def _cancel_all() -> None:
    current = asyncio.current_task()
    tasks = [task for task in asyncio.all_tasks() if task is not current]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


_loop: _LoopThread | None = None
_loop_lock = threading.Lock()


def background_loop() -> _LoopThread:
    global _loop
    with _loop_lock:
        if _loop is None:
            _loop = _LoopThread()
        return _loop


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
