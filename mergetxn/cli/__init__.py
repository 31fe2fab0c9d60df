"""The ``mergetxn`` command line: run the servers, operate tables, and see the product work.

Servers run in the foreground (``zk start``, ``replica start``) so a process supervisor or a
terminal owns them. Client commands talk to one replica (``--replica host:port`` or
``MERGETXN_REPLICA``) and wait ``--timeout`` seconds at most for it to answer. Every error ends
the command with one red line ``error: <message>`` on stderr and an exit code that says which
kind of error it was (:data:`EXIT_CODES`), never a traceback (unless ``--log-level DEBUG``): an
operator should see what was wrong, not where in the code it was found.

A module per command group (``tables``, ``insert``, ``data``, ``maintenance``, ``backup``,
``status``, ``servers``, ``transactions``, ``security``, ``chaos``, ``quickstart``), the group
itself in ``root``, and what they share in ``output`` (talking to a replica, printing, exit
codes), ``options``, ``parsing`` and ``files``.
"""

from mergetxn.cli.output import (
    EXIT_ABORTED,
    EXIT_AUTH,
    EXIT_CODES,
    EXIT_CONFLICT,
    EXIT_CORRUPT,
    EXIT_DENIED,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_UNHEALTHY,
    EXIT_USAGE,
    connected,
    exit_code,
)
from mergetxn.cli.parsing import parse_schema
from mergetxn.cli.root import cli, main

__all__ = [
    "EXIT_ABORTED",
    "EXIT_AUTH",
    "EXIT_CODES",
    "EXIT_CONFLICT",
    "EXIT_CORRUPT",
    "EXIT_DENIED",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_UNAVAILABLE",
    "EXIT_UNHEALTHY",
    "EXIT_USAGE",
    "cli",
    "connected",
    "exit_code",
    "main",
    "parse_schema",
]
