"""The old name of :mod:`mergetxn.client` (the Python client moved there): ``coordinator.api.client``,
``coordinator.api.arguments`` and ``coordinator.api.heartbeat`` are the very same module objects as
``mergetxn.client.client``, ``mergetxn.client.arguments`` and ``mergetxn.client.heartbeat``."""
