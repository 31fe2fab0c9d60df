"""The old name of :mod:`mergetxn.client.arguments`, kept as an alias: the very same module object
(docs/architecture/index.md#folders-and-floors)."""

import sys

from mergetxn.client import arguments

sys.modules[__name__] = arguments
