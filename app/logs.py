"""Logging: one JSON object per line by default (``--log-format text`` for humans)."""

from __future__ import annotations

import collections
import logging
import sys
import threading
import time

import orjson

_RESERVED = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime", "color_message"}


def extra_fields(record: logging.LogRecord) -> dict:
    """What the caller passed as ``extra``: every attribute a plain LogRecord lacks."""
    return {k: v for k, v in record.__dict__.items() if k not in _RESERVED and not k.startswith("_")}


class JSONFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, then the caller's fields."""

    _second = -1
    _second_text = ""

    def _timestamp(self, created: float) -> str:
        second = int(created)
        if second != self._second:  # formatted once a second; a race only formats it twice
            self._second_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = second
        return f"{self._second_text}.{int((created - second) * 1000):03d}Z"

    def format(self, record: logging.LogRecord) -> str:
        exc = self.formatException(record.exc_info) if record.exc_info else None
        return self.line(record.created, record.levelname, record.name, record.getMessage(), extra_fields(record), exc)

    def line(self, created: float, levelname: str, name: str, msg: str, fields: dict, exc: str | None = None) -> str:
        out = {"ts": self._timestamp(created), "level": levelname.lower(), "logger": name, "msg": msg}
        out.update(fields)
        if exc:
            out["exc"] = exc
        return orjson.dumps(out, default=str).decode()


def _text_value(value: object) -> str:
    """A field value for a text line: as is when it is one printable word, else a JSON string (so a newline or
    an escape sequence in it can neither start a forged line nor reach the terminal)."""
    text = value if isinstance(value, str) else str(value)
    if text and text.isprintable() and not any(c in text for c in ' "=\\'):
        return text
    return orjson.dumps(text).decode()


def _text_message(msg: str) -> str:
    """The message, with what JSON would escape escaped the same way (spaces and quotes kept)."""
    return msg if msg.isprintable() else orjson.dumps(msg).decode()[1:-1].replace('\\"', '"')


class TextFormatter(logging.Formatter):
    """One line per record for humans, escaped like the JSON lines: nothing a client sends can break it."""

    def format(self, record: logging.LogRecord) -> str:
        exc = self.formatException(record.exc_info) if record.exc_info else None
        return self.line(record.created, record.levelname, record.name, record.getMessage(), extra_fields(record), exc)

    def line(self, created: float, levelname: str, name: str, msg: str, fields: dict, exc: str | None = None) -> str:
        line = f"{time.strftime('%H:%M:%S', time.localtime(created))} {levelname:<7} {_text_message(msg)}"
        if fields:
            line += " " + " ".join(f"{k}={_text_value(v)}" for k, v in fields.items())
        if exc:
            line += "\n" + exc  # our own traceback: the one multi-line record
        return line


def structured(logger: logging.Logger, level: int, msg: str, fields: dict) -> None:
    """``logger.log(level, msg, extra=fields)``, for a line logged on every admission decision.

    When every handler the line can reach is a ``BatchingStreamHandler`` with one of
    the formatters above, and no logger or handler on the way has a filter (what
    ``serve`` sets up), the line is formatted and queued directly: same text, none
    of the LogRecord machinery, which costs several times the line itself. In any
    other set-up (tests capturing logs, a filter, a foreign handler) this is exactly
    ``logger.log``.
    """
    if not logger.isEnabledFor(level):
        return
    handlers = _direct_handlers(logger)
    if handlers is None:
        logger.log(level, msg, extra=fields)
        return
    created = time.time()
    levelname = logging.getLevelName(level)
    for h in handlers:
        if level >= h.level:
            h.queue(h.formatter.line(created, levelname, logger.name, msg, fields), level)  # type: ignore[union-attr]


def _direct_handlers(logger: logging.Logger) -> list[BatchingStreamHandler] | None:
    out: list[BatchingStreamHandler] = []
    lg: logging.Logger | None = logger
    while lg is not None:
        if lg.filters:
            return None
        for h in lg.handlers:
            if type(h) is not BatchingStreamHandler or h.filters or not hasattr(h.formatter, "line"):
                return None
            out.append(h)
        lg = lg.parent if lg.propagate else None  # type: ignore[assignment]
    return out


FLUSH_INTERVAL = 0.1  # seconds an INFO line may wait to be written
WAKE_AT = 512  # pending lines that wake the writer before the interval is up
MAX_PENDING_BYTES = 8 << 20  # characters held while the reader of stderr is stuck; beyond that, lines are dropped


class BatchingStreamHandler(logging.StreamHandler):
    """A StreamHandler whose writes happen in a background thread, in batches.

    At one line per admission decision, writing each line to stderr (a system call,
    and a wake-up of whatever reads the pipe) costs more than building it, and a
    slow reader of the pipe would stall the event loop inside ``write``. Here the
    logging thread only appends the formatted line to a deque (atomic, no I/O); a
    daemon thread writes what is pending every ``FLUSH_INTERVAL`` seconds, at once
    for WARNING and above or when ``WAKE_AT`` lines are waiting, and ``flush()`` /
    ``close()`` (``logging.shutdown`` at exit) write everything. Only the writer
    thread blocks on a slow reader; if lines pile up past ``MAX_PENDING_BYTES``
    (counted in characters, whatever the lines' lengths) they are dropped and
    counted, and the count is written as soon as writing works again."""

    def __init__(self, stream, interval: float = FLUSH_INTERVAL) -> None:
        super().__init__(stream)
        self._pending: collections.deque[str] = collections.deque()
        self._write_lock = threading.Lock()  # one writer at a time keeps batches in order
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._size_lock = threading.Lock()  # the pending size is added to by loggers and taken by the writer
        self._pending_size = 0
        self.dropped = 0
        threading.Thread(target=self._write_every, args=(interval,), name="log-writer", daemon=True).start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.queue(self.format(record), record.levelno)
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)

    def queue(self, line: str, level: int) -> None:
        """Queue one formatted line (``structured`` calls this directly)."""
        size = len(line) + 1
        with self._size_lock:
            if self._pending_size + size > MAX_PENDING_BYTES:
                self.dropped += 1
                return
            self._pending_size += size
        self._pending.append(line + self.terminator)
        if level >= logging.WARNING or len(self._pending) >= WAKE_AT:
            self._wake.set()

    def flush(self) -> None:
        """Write every pending line. Never takes the handler's lock (``logging.shutdown``
        calls this while holding it), so it cannot deadlock with ``emit``."""
        with self._write_lock:
            lines = []
            while self._pending:
                lines.append(self._pending.popleft())
            taken = sum(map(len, lines))
            with self._size_lock:
                self._pending_size -= taken
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
