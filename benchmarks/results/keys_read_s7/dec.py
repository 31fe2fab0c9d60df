import os, random, sys, time, zlib
from concurrent.futures import ThreadPoolExecutor
import pyarrow as pa, pyarrow.parquet as pq, pyarrow.compute as pc
sys.path.insert(0, os.environ["PYTHONPATH"])
from coordinator.core import keytables, keyfold
from parts.io import format as fmt
N = 1_000_000
schema = pa.schema([pa.field("k", pa.int64(), nullable=False), pa.field("v", pa.int64()), pa.field("s", pa.string())])
def rows(ks, v):
    return pa.table({"k": pa.array(ks, pa.int64()), "v": pa.array([v] * len(ks), pa.int64()), "s": pa.array([f"s{k % 1000}" for k in ks])}, schema=schema)
rng = random.Random(3); order = list(range(N)); rng.shuffle(order); per = N // 100
batches = [rows(order[i*per:(i+1)*per], 0) for i in range(100)] + [rows(sorted(rng.sample(range(N), N // 100)), r + 1) for r in range(20)]
kraws = [fmt._parquet_bytes(fmt._sorted_by_key(keytables.versions(schema, ("k",), "t", b, keytables.PUT, 0), ("k",)), fmt.KEYS_ROW_GROUP_ROWS) for b in batches]
praws = [fmt._parquet_bytes(b, None) for b in batches[:100]]
plan = keyfold.ReadPlan(("k", "v", "s"), (keytables.SEQ,), True)
def kdec(raw, ut=False):
    zlib.crc32(raw)
    pf = pq.ParquetFile(pa.BufferReader(raw))
    d = pf.read(columns=["k", "v", "s"], use_threads=ut)
    keyfold.also_read(plan, d, ("k",))
    return keyfold.completed(plan, d)
def pdec(raw, ut=True):
    zlib.crc32(raw)
    return pq.ParquetFile(pa.BufferReader(raw)).read(use_threads=ut)
def run(f, raws, w, ut):
    c, t = time.process_time(), time.perf_counter()
    if w == 0:
        [f(r, ut) for r in raws]
    else:
        with ThreadPoolExecutor(max_workers=w) as pool:
            list(pool.map(lambda r: f(r, ut), raws))
    return (time.perf_counter() - t) * 1e3, (time.process_time() - c) * 1e3
for rnd in range(2):
    for name, f, raws in (("keys", kdec, kraws), ("parts", pdec, praws)):
        for w in (0, 2, 4, 8):
            for ut in (False, True):
                b = min((run(f, raws, w, ut) for _ in range(5)), key=lambda x: x[0])
                print(f"{name:5s} threads {w} arrow-threads {ut!s:5s} wall {b[0]:6.1f} cpu {b[1]:6.1f}", flush=True)
