"""The event loop every client shares, and the blocking twins of async methods.

Importing it imports no Ray: the REST admin client (``clients.http``) and the
Admin Client API (``clients.admin_calls``) use it without joining a cluster.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import functools
import inspect
import threading
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from clients._inbox import fail_every_inbox
from runtime.connect import before_disconnect
from runtime.errors import ClientClosedError

P = ParamSpec("P")
T = TypeVar("T")

# How often a blocking call looks whether the loop it waits on was stopped under it.
STOPPED_LOOK_S = 1.0


class _LoopThread:
    """One daemon thread running an event loop, so sync APIs can drive async code
    from anywhere (plain scripts, Jupyter, Ray tasks, even inside async actors)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.stopped = False
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="raytopics-loop", daemon=True
        )
        self._thread.start()
        # atexit runs handlers last-in first-out and Ray registered its shutdown when it was
        # imported, so this runs first: a task still awaiting an actor call when the script
        # ends would otherwise touch Ray's core worker after shutdown, which exits with 1.
        atexit.register(self.stop)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """``coro``'s result; ``ClientClosedError`` once the loop is stopped (a stopped
        loop never runs what is handed to it, so waiting would hang)."""
        if self.stopped:
            coro.close()
            raise _closed()
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        while True:
            try:
                return future.result(timeout=STOPPED_LOOK_S)
            except TimeoutError:
                if future.done():  # the coroutine's own
                    raise
                if self.stopped and not self.loop.is_running():
                    future.cancel()
                    raise _closed() from None
            except concurrent.futures.CancelledError:
                if self.stopped:  # cancelled by ``stop``
                    raise _closed() from None
                raise

    def stop(self, grace_s: float = 2.0) -> None:
        """Cancel whatever is still running on the loop, then stop its thread."""
        self.stopped = True
        if not self.loop.is_running():
            return
        with contextlib.suppress(TimeoutError):
            asyncio.run_coroutine_threadsafe(_cancel_all(), self.loop).result(grace_s)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(grace_s)


def _closed() -> ClientClosedError:
    return ClientClosedError("closed: this process left Ray (runtime.disconnect)")


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
            before_disconnect(_stop_background_loop)
        return _loop


def _stop_background_loop() -> None:
    """Before Ray shuts down (``runtime.connect.disconnect``): the loop's calls end, and
    clients made after a later ``connect`` get a loop of their own."""
    global _loop
    with _loop_lock:
        loop, _loop = _loop, None
    if loop is not None:
        loop.stop()
        fail_every_inbox(_closed())


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
