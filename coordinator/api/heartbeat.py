"""The old name of :mod:`mergetxn.client.heartbeat`, kept as an alias: the very same module object
(docs/architecture/index.md#folders-and-floors)."""

import sys

from mergetxn.client import heartbeat

sys.modules[__name__] = heartbeat
