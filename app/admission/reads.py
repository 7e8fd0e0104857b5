"""Reads before an allow (``app.cluster.fresh``), shared per node and bounded per second, on the event loop."""

from __future__ import annotations

import asyncio
import time

from app.ratelimit import TokenBucket


class ReadRefused(Exception):
    """More reads per second than the bound: the store's answer stands."""


class SharedReads:
    """``view_of(node)`` (blocking) shared and bounded, for the event loop: a future of the node's fresh view.

    Forged reviews that the policy would allow each ask for a read; unchecked, one client makes the guard list
    VMIs hundreds of times a second. A request needs a read sent after it arrived (one in flight may have been
    sent before the mark it must see was written). So a request that comes while a read of its node runs starts
    the next read at once, and those that come while two run share one more, started when either ends: at most
    ``per_node`` reads of a node in flight. (Waiting for the running read to end first would make a request's
    answer wait on a read that cannot serve it: one slow read, a new connection, say, and the next request's own
    read never starts within its time.) And at most ``per_second`` reads start per second (a token bucket holding
    ``burst``); past that the future fails with ``ReadRefused`` and the caller fails open, visibly. Call from the
    event loop's thread only.
    """

    def __init__(self, read, per_second: float = 20.0, burst: float = 20.0, monotonic=None, per_node: int = 2) -> None:
        self.read = read
        self.per_second, self.burst, self.per_node = per_second, burst, per_node
        self.monotonic = monotonic or time.monotonic
        self.budget = TokenBucket(per_second, burst, self.monotonic)
        self._inflight: dict[str, list] = {}
        self._next: dict[str, object] = {}

    def view_of(self, node: str):
        waiting = self._next.get(node)
        if waiting is not None:
            return waiting
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        future.add_done_callback(_retrieved)
        if len(self._inflight.get(node, ())) >= self.per_node:
            self._next[node] = future
        else:
            self._start(node, future)
        return future

    def _start(self, node: str, future) -> None:
        if not self.budget.take():
            future.set_exception(ReadRefused(f"more than {self.per_second:g} reads per second"))
            return
        self._inflight.setdefault(node, []).append(future)
        task = asyncio.get_running_loop().run_in_executor(None, self.read, node)
        task.add_done_callback(lambda done: self._done(node, future, done))

    def _done(self, node: str, future, done) -> None:
        running = self._inflight[node]
        running.remove(future)
        if not running:
            del self._inflight[node]
        if not future.done():
            if done.cancelled():
                future.cancel()
            elif done.exception() is not None:
                future.set_exception(done.exception())
            else:
                future.set_result(done.result())
        waiting = self._next.pop(node, None)
        if waiting is not None and not waiting.done():
            self._start(node, waiting)


def _retrieved(future) -> None:
    """Every waiter may have timed out: the outcome is still looked at, so asyncio does not warn about it."""
    if not future.cancelled():
        future.exception()
