"""The Python client: ``Client``, ``Transaction``, their argument checks and the session
heartbeat."""
