"""Logging of mergetxn's processes (the ``mergetxn`` command line and replica servers).

One spec sets it: ``LEVEL`` for mergetxn's own loggers (``coordinator``, ``replicas``,
``parts``, ``spark``, ``mergetxn``), optionally followed by ``name=LEVEL`` items for any other
logger, e.g. ``"DEBUG"`` or ``"INFO,kazoo=DEBUG"``. Every other library stays at WARNING unless
named: at DEBUG kazoo logs every ZooKeeper packet and botocore every request, signatures
included. Lines go to stderr, or to a file (appended) when one is given. Environment defaults:
``MERGETXN_LOG`` (the spec) and ``MERGETXN_LOG_FILE``.

A log file is rotated from outside (``logrotate``, then ``kill -HUP``): a replica's SIGHUP calls
:func:`reopen`, which opens the file at its path again (a new one if it was moved away); the
handler also notices by itself that its file was moved or removed (``WatchedFileHandler``), so a
line is never written into a rotated-away file for long.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import sys
import weakref
from pathlib import Path

from coordinator.core.errors import InvalidInput

OWN = ("coordinator", "replicas", "parts", "spark", "mergetxn")
ENV_LEVEL = "MERGETXN_LOG"
ENV_FILE = "MERGETXN_LOG_FILE"
FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

_configured = False
_OURS: weakref.WeakSet[logging.Handler] = weakref.WeakSet()  # the handlers setup() installed


def parse(spec: str) -> dict[str, int]:
    """``"INFO,kazoo=DEBUG"`` as levels by logger name ("" for mergetxn's own)."""
    out: dict[str, int] = {}
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        name, _, level = item.rpartition("=")
        level = level.strip().upper()
        if level not in _LEVELS:
            raise InvalidInput(f"log level {level!r} in {spec!r} is not one of {', '.join(_LEVELS)}")
        out[name.strip()] = getattr(logging, level)
    return out


def configure(spec: str | None = None, file: str | os.PathLike | None = None) -> None:
    """Set up logging for this process (see the module docstring); ``None`` takes the
    environment's value, and the level defaults to WARNING. Called again, it replaces the
    handler it installed."""
    global _configured
    spec = os.environ.get(ENV_LEVEL, "WARNING") if spec is None else spec
    file = os.environ.get(ENV_FILE) or None if file is None else file
    levels = parse(spec)
    root = logging.getLogger()
    for h in [h for h in root.handlers if h in _OURS]:
        root.removeHandler(h)
        h.close()
    if file is not None:
        try:
            Path(file).parent.mkdir(parents=True, exist_ok=True)
            handler: logging.Handler = logging.handlers.WatchedFileHandler(file, encoding="utf-8")
        except OSError as exc:
            raise InvalidInput(f"cannot open log file {file}: {exc}") from None
    else:
        handler = _Stderr()
    handler.setFormatter(logging.Formatter(FORMAT))
    _OURS.add(handler)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)  # every other library, unless named
    own = levels.pop("", logging.WARNING)
    for name in OWN:
        logging.getLogger(name).setLevel(own)
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
    _configured = True


class _Stderr(logging.StreamHandler):
    """To whatever ``sys.stderr`` is when a line is written (a test harness swaps it)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def reopen() -> None:
    """Open the log file again at its path (after a rotation: a replica's SIGHUP); nothing for
    stderr. Each handler's own lock orders it with the threads writing lines."""
    for h in logging.getLogger().handlers:
        if h in _OURS and isinstance(h, logging.FileHandler):
            h.acquire()
            try:
                if h.stream is not None:
                    h.stream.close()
                h.stream = h._open()
                if isinstance(h, logging.handlers.WatchedFileHandler):
                    h._statstream()
            finally:
                h.release()
    logging.getLogger(__name__).info("log file reopened")


def configured() -> bool:
    """Whether :func:`configure` ran in this process (a replica started by the CLI keeps the
    CLI's set-up)."""
    return _configured


def debugging() -> bool:
    """Whether mergetxn's own loggers log DEBUG (the CLI then shows tracebacks)."""
    return logging.getLogger("mergetxn").isEnabledFor(logging.DEBUG)
