"""The pure core: rules, arithmetic and encodings with no I/O (no ZooKeeper, no storage,
no sockets), tested exhaustively: errors, tids and CSNs, visibility, the conflict rules, read
sets, grants, keys tables' rules and fold, and the table-data rules (names, schemas, conform,
partitions, predicates)."""
