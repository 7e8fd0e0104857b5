"""Whether steering is on, and why not: which Prometheus the guard reads, found how.

``--steering auto`` (the default): ``--prometheus-url`` when given, else the Prometheus the
descheduler's own policy names (``discovery``); ``--steering off``: never. The state is one of

    on              Prometheus answers with the descheduler's node scores
    disabled        --steering off
    not_configured  no --prometheus-url, and nothing to discover from (a snapshot, or no policy ConfigMaps)
    not_found       no policy names a Prometheus (or the guard may not read it)
    pending         the policy is being read, or a Prometheus is known and its first query round has not ended
    unreachable     it does not answer, or answers with an error
    no_data         it answers without the descheduler's series, or with stale ones

exported as ``steering_state{state=...}`` (exactly one is 1), logged when it changes, and shown by ``report``.

``serve`` discovers in the background (its first round at once); ``explain`` and ``report`` before they decide.
A discovered Prometheus that has never answered with data leaves every decision as it is without steering
(``usage`` is None); once it has, it fails open as an explicit ``--prometheus-url`` does (``metrics_unavailable``).
While the provider came from discovery, or none was found, the policies are read again every ``rediscover_every``
seconds and a changed provider replaces the poller.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from app.domain.usage import UsageSnapshot
from app.metricsource.discovery import Discovery, Provider
from app.metricsource.prometheus import PrometheusSource

log = logging.getLogger("kubevirt_eviction_guard.prometheus")

ON, DISABLED, NOT_CONFIGURED, NOT_FOUND, PENDING = "on", "disabled", "not_configured", "not_found", "pending"
STATES = (ON, DISABLED, NOT_CONFIGURED, NOT_FOUND, PENDING, "unreachable", "no_data")
FLAG = "--prometheus-url"


class Steering:
    """The current Prometheus poller (or none), how it was found, and the steering state."""

    def __init__(self, source: PrometheusSource | None, origin: str, state: str = NOT_CONFIGURED, why: str = "", *,
                 discovered: bool = False, rediscover: Callable[[], Discovery] | None = None,
                 build: Callable[[Provider], PrometheusSource] | None = None, rediscover_every: float = 300.0,
                 metrics=None) -> None:
        self.source, self.origin, self.discovered = source, origin, discovered
        self._state, self._why = state, why
        self.provider: Provider | None = None
        self.rediscover, self.build, self.rediscover_every = rediscover, build, rediscover_every
        self._said: tuple[str, str] | None = None
        self._first = False  # discover at once when started (``discovering``)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        if source is not None:
            source.on_round = self.said
        if metrics is not None:
            for s in STATES:
                metrics.steering_state.labels(s).set_function(lambda s=s: 1.0 if self.state()[0] == s else 0.0)

    @classmethod
    def found(cls, discovery: Discovery, build: Callable[[Provider], PrometheusSource], **kw) -> Steering:
        """From a discovery: a poller for its provider, or the state ``not_found`` with what was seen."""
        if discovery.provider is None:
            return cls(None, "", NOT_FOUND, discovery.why, build=build, **kw)
        steering = cls(build(discovery.provider), discovery.provider.where, discovered=True, build=build, **kw)
        steering.provider = discovery.provider
        return steering

    # -- state -------------------------------------------------------------

    def state(self) -> tuple[str, str]:
        """``(state, why)``; ``why`` is "" when on."""
        source = self.source
        if source is None:
            return self._state, self._why
        return source.state()

    def usage(self) -> UsageSnapshot | None:
        """What decisions steer by: None (no steering) without a poller, or before a discovered one first had data."""
        source = self.source
        if source is None or (self.discovered and not source.rounds_ok):
            return None
        return source.current()

    def fields(self) -> dict:
        """For ``report`` and the start-up log: state, why, the URL and where it came from."""
        state, why = self.state()
        source = self.source
        return {"state": state, "why": why or None, "url": source.url if source is not None else None,
                "from": self.origin or None}

    def said(self) -> None:
        """Log the state when it changed (after every query round, and on start and rediscovery)."""
        now = self.state()
        if self._said is not None and now[0] == self._said[0]:
            return  # the poller logs each new problem itself
        self._said = now
        extra = {k: v for k, v in self.fields().items() if v is not None}
        if now[0] == ON:
            log.info("steering on", extra=extra)
        elif now[0] == PENDING:
            log.info("steering pending", extra=extra)
        else:
            log.info("steering off", extra=extra)

    # -- lifecycle ---------------------------------------------------------

    @classmethod
    def discovering(cls, rediscover: Callable[[], Discovery], build: Callable[[Provider], PrometheusSource],
                    **kw) -> Steering:
        """Discovery in the background, the first at once (start-up does not wait on the API server)."""
        steering = cls(None, "", PENDING, "reading the descheduler's policy", rediscover=rediscover, build=build, **kw)
        steering._first = True
        return steering

    def _swap(self, discovery: Discovery) -> None:
        if discovery.provider is None and self.source is not None and not discovery.certain:
            return  # the policy could not be read just now: keep what was found
        if discovery.provider is None and self.source is None:
            self._state, self._why = NOT_FOUND, discovery.why
            self.said()
            return
        if discovery.provider == self.provider:
            return
        old = self.source
        with self._lock:
            if discovery.provider is None:
                self.source, self.provider, self.origin = None, None, ""
                self._state, self._why = NOT_FOUND, discovery.why
            else:
                assert self.build is not None
                source = self.build(discovery.provider)
                source.on_round = self.said
                self.source, self.provider, self.origin = source, discovery.provider, discovery.provider.where
                self.discovered = True
        if old is not None:
            old.stop()
        self.said()
        if self.source is not None and not self._stop.is_set():
            self.source.start()

    def _run(self) -> None:
        while not self._stop.wait(0.0 if self._first else self.rediscover_every):
            self._first = False
            try:
                assert self.rediscover is not None
                self._swap(self.rediscover())
            except Exception:  # a bug here must not end rediscovery for the life of the process
                log.exception("steering: rediscovery failed; keeping what was found")

    def start(self) -> Steering:
        self.said()
        if self.source is not None:
            self.source.start()
        if self.rediscover is not None and (self.discovered or self.source is None):
            self._thread = threading.Thread(target=self._run, name="steering-rediscovery", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.source is not None:
            self.source.stop()
