"""Decode cost of a 10,000-key part written in 8,192-row groups (two) against one group, the
bench's layout: k sorted, v constant, s = 's{k%1000}'; CPU of 300 decodes of k,v,s, one thread."""
import os, random, sys, time
import pyarrow as pa, pyarrow.parquet as pq
sys.path.insert(0, os.environ["PYTHONPATH"])
from coordinator.core import keytables
from parts.io import format as fmt
schema = pa.schema([pa.field("k", pa.int64(), nullable=False), pa.field("v", pa.int64()), pa.field("s", pa.string())])
keys = sorted(random.Random(1).sample(range(1_000_000), 10_000))
data = pa.table({"k": pa.array(keys, pa.int64()), "v": pa.array([0] * 10_000, pa.int64()), "s": pa.array([f"s{k % 1000}" for k in keys])})
versions = keytables.versions(schema, ("k",), "t", data, keytables.PUT, 0)
files = {g: fmt._parquet_bytes(versions, row_group_size=g) for g in (8192, 10_000, 16384)}
plain = fmt._parquet_bytes(data, row_group_size=None)
files["parts-file"] = plain
for rnd in range(3):
    for g, raw in files.items():
        c = time.process_time()
        for _ in range(300):
            pf = pq.ParquetFile(pa.BufferReader(raw))
            pf.read(columns=["k", "v", "s"], use_threads=False)
        print(f"{g!s:10} groups {pq.ParquetFile(pa.BufferReader(raw)).metadata.num_row_groups} size {len(raw):7d} cpu per decode {(time.process_time() - c) / 300 * 1e3:.3f} ms")
