"""The read tasks of an incremental read: rows of changes that the replica selected, planned
into partitions as Arrow IPC (the batch source's ``changes_*`` reads and the stream source).
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from spark.schema import fit

IPC_ROWS = 1_000_000  # rows per planned partition


class ChangesPartition(InputPartition):
    """One read task of an incremental read: rows already selected by the replica (Arrow IPC)."""

    def __init__(self, index: int, ipc: bytes) -> None:
        super().__init__(index)
        self.ipc = ipc

    def __repr__(self) -> str:
        return f"ChangesPartition({self.value}, {len(self.ipc)} bytes)"


def changes_partitions(data: pa.Table) -> list[ChangesPartition]:
    """``data`` (rows of changes) as read tasks of at most :data:`IPC_ROWS` rows each."""
    out = []
    for i, batch in enumerate(data.combine_chunks().to_batches(max_chunksize=IPC_ROWS)):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as w:
            w.write_batch(batch)
        out.append(ChangesPartition(i, sink.getvalue().to_pybytes()))
    return out


def read_changes(partition: ChangesPartition, target: pa.Schema) -> Iterator[pa.RecordBatch]:
    """A read task's rows, as Spark asked for them (``target``)."""
    with pa.ipc.open_stream(partition.ipc) as r:
        for batch in r:
            yield fit(pa.Table.from_batches([batch]), target).to_batches()[0]
