"""The typed model: every record one layer writes for another to read (log entries, WAL
records, alive nodes, transaction records), table definitions, users, atomicity. Pure."""
