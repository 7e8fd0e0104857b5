"""Logging: one JSON object per line by default (``--log-format text`` for humans)."""

from __future__ import annotations

import collections
import logging
import sys
import threading
import time

import orjson

_RESERVED = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime", "color_message"}


class JSONFormatter(logging.Formatter):
    """One JSON object per record. Called once per admission decision, so it is kept
    lean: the second-resolution part of the timestamp is formatted once a second."""

    _second = -1
    _second_text = ""

    def _timestamp(self, record: logging.LogRecord) -> str:
        second = int(record.created)
        if second != self._second:  # handlers format under their lock: no race here
            self._second_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = second
        return f"{self._second_text}.{int(record.msecs):03d}Z"

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": self._timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for k, v in record.__dict__.items():
            if k not in _RESERVED and not k.startswith("_"):
                out[k] = v
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        extra = " ".join(f"{k}={v}" for k, v in record.__dict__.items() if k not in _RESERVED and not k.startswith("_"))
        line = f"{time.strftime('%H:%M:%S', time.localtime(record.created))} {record.levelname:<7} {record.getMessage()}"
        if extra:
            line += " " + extra
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


FLUSH_INTERVAL = 0.1  # seconds an INFO line may wait to be written
WAKE_AT = 512  # pending lines that wake the writer before the interval is up
MAX_PENDING = 50_000  # lines held while the reader of stderr is stuck; beyond that, lines are dropped


class BatchingStreamHandler(logging.StreamHandler):
    """A StreamHandler whose writes happen in a background thread, in batches.

    At one line per admission decision, writing each line to stderr (a system call,
    and a wake-up of whatever reads the pipe) costs more than building it, and a
    slow reader of the pipe would stall the event loop inside ``write``. Here the
    logging thread only appends the formatted line to a deque (atomic, no I/O); a
    daemon thread writes what is pending every ``FLUSH_INTERVAL`` seconds, at once
    for WARNING and above or when ``WAKE_AT`` lines are waiting, and ``flush()`` /
    ``close()`` (``logging.shutdown`` at exit) write everything. Only the writer
    thread blocks on a slow reader; if lines pile up past ``MAX_PENDING`` they are
    dropped and counted, and the count is written as soon as writing works again."""

    def __init__(self, stream, interval: float = FLUSH_INTERVAL) -> None:
        super().__init__(stream)
        self._pending: collections.deque[str] = collections.deque()
        self._write_lock = threading.Lock()  # one writer at a time keeps batches in order
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.dropped = 0
        threading.Thread(target=self._write_every, args=(interval,), name="log-writer", daemon=True).start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if len(self._pending) >= MAX_PENDING:
                self.dropped += 1
                return
            self._pending.append(self.format(record) + self.terminator)
            if record.levelno >= logging.WARNING or len(self._pending) >= WAKE_AT:
                self._wake.set()
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)

    def flush(self) -> None:
        """Write every pending line. Never takes the handler's lock (``logging.shutdown``
        calls this while holding it), so it cannot deadlock with ``emit``."""
        with self._write_lock:
            lines = []
            while self._pending:
                lines.append(self._pending.popleft())
            if self.dropped:
                lines.append(self.format(logging.makeLogRecord({
                    "name": "kubevirt_eviction_guard.logs", "levelno": logging.WARNING, "levelname": "WARNING",
                    "msg": f"{self.dropped} log lines dropped: stderr was not being read"})) + self.terminator)
                self.dropped = 0
            if lines:
                self.stream.write("".join(lines))
            if hasattr(self.stream, "flush"):
                self.stream.flush()

    def _write_every(self, interval: float) -> None:
        while not self._stop.is_set():
            self._wake.wait(interval)
            self._wake.clear()
            try:
                self.flush()
            except Exception:  # a broken stream: those lines are lost, the next batch may fare better
                pass

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self.flush()
        super().close()


def batch_writes(interval: float = FLUSH_INTERVAL) -> None:
    """Switch the root logger's stream handler to batched writes (for ``serve``)."""
    root = logging.getLogger()
    for i, h in enumerate(root.handlers):
        if type(h) is logging.StreamHandler:
            batching = BatchingStreamHandler(h.stream, interval)
            batching.setFormatter(h.formatter)
            batching.setLevel(h.level)
            root.handlers[i] = batching


def configure(fmt: str = "json", level: str = "INFO") -> None:
    # Skip per-record work whose result no formatter here prints: the caller's file and
    # line (a stack walk), thread and process names (Logging HOWTO, "Optimization").
    # Worth it at one record per admission decision.
    logging._srcfile = None  # type: ignore[attr-defined]
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JSONFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers[:] = []
        lg.propagate = True
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)
