"""Logging: one JSON object per line by default (``--log-format text`` for humans)."""

from __future__ import annotations

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


FLUSH_INTERVAL = 0.1  # seconds an INFO line may wait in the batch
MAX_BATCH = 512  # lines; a fuller batch is written at once


class BatchingStreamHandler(logging.StreamHandler):
    """A StreamHandler that writes lines in batches: at one line per admission decision,
    a write to stderr per line (a system call, and a wake-up of whatever reads the pipe)
    costs more than building the line. INFO and below wait up to ``FLUSH_INTERVAL``
    (a daemon thread flushes); WARNING and above are written at once, with everything
    queued before them. ``flush()`` and ``close()`` (``logging.shutdown`` at exit) write
    what is pending, so nothing is lost short of the process being killed."""

    def __init__(self, stream, interval: float = FLUSH_INTERVAL) -> None:
        super().__init__(stream)
        self._pending: list[str] = []
        self._stop = threading.Event()
        threading.Thread(target=self._flush_every, args=(interval,), name="log-flush", daemon=True).start()

    def emit(self, record: logging.LogRecord) -> None:  # called under the handler's lock
        try:
            self._pending.append(self.format(record) + self.terminator)
            if record.levelno >= logging.WARNING or len(self._pending) >= MAX_BATCH:
                self.flush()
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            if self._pending:
                text = "".join(self._pending)
                self._pending.clear()
                self.stream.write(text)
            super().flush()

    def _flush_every(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.flush()
            except Exception:  # a broken stream: those lines are lost, the next batch may fare better
                pass

    def close(self) -> None:
        self._stop.set()
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
