"""The old name of :mod:`mergetxn.client.client`, kept as an alias: the very same module object
(docs/architecture/index.md#folders-and-floors)."""

import sys

from mergetxn.client import client

sys.modules[__name__] = client
