"""The operator's tools behind the CLI: quickstart, status, recovery, JSON rows."""
