"""The bench's 120 parts built in memory (written as the keys writer writes them, decoded as a
whole read plans), then merge's steps timed, CPU, best of R."""
import os, random, sys, time
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
raws = [fmt._parquet_bytes(fmt._sorted_by_key(keytables.versions(schema, ("k",), "t", b, keytables.PUT, 0), ("k",)), fmt.KEYS_ROW_GROUP_ROWS) for b in batches]
plan = keyfold.ReadPlan(("k", "v", "s"), (keytables.SEQ,), True)
def decode(raw):
    pf = pq.ParquetFile(pa.BufferReader(raw))
    return keyfold.completed(plan, pf.read(columns=["k", "v", "s"], use_threads=False))
parts = [(10 + i, decode(r)) for i, r in enumerate(raws)]
R = 7
def best(f):
    b = 1e9
    for _ in range(R):
        c = time.process_time(); out = f(); b = min(b, time.process_time() - c)
    return b * 1e3, out
print(f"merge        {best(lambda: keyfold.merge(schema, ('k',), parts))[0]:6.1f} ms")
print(f"_in_csn_order{best(lambda: keyfold._in_csn_order(list(parts)))[0]:6.1f}")
live = parts
print(f"_rising      {best(lambda: keyfold._rising([t.column('k') for _, t in live]))[0]:6.1f}")
print(f"_passed_thr  {best(lambda: keyfold._passed_through(schema, 'k', live))[0]:6.1f}")
t, data = best(lambda: keyfold._versions(schema, parts)); print(f"_versions    {t:6.1f}")
op = data.column(keytables.OP)
print(f"op checks    {best(lambda: (pc.min_max(op), pc.any(pc.equal(op, 1)).as_py()))[0]:6.1f}")
print(f"ordered chk  {best(lambda: any(keytables.VER in t.column_names for _, t in live))[0]:6.1f}")
t, slots = best(lambda: keyfold._last_by_slot(data.column('k'))); print(f"_last_by_slot{t:6.1f}")
col = data.column('k')
print(f"  combine k  {best(lambda: col.combine_chunks())[0]:6.1f}")
kk = col.combine_chunks()
print(f"  minmax     {best(lambda: pc.min_max(kk))[0]:6.1f}")
off = pc.subtract(kk, 0)
print(f"  subtract   {best(lambda: pc.subtract(kk.cast(pa.int64()), pa.scalar(0, pa.int64())).cast(pa.int64()))[0]:6.1f}")
print(f"  inv_perm   {best(lambda: pc.inverse_permutation(off, max_index=N - 1, output_type=pa.int32()))[0]:6.1f}")
inv = pc.inverse_permutation(off, max_index=N - 1, output_type=pa.int32())
print(f"  drop_null  {best(lambda: pc.drop_null(inv))[0]:6.1f}")
for c in schema.names:
    print(f"take {c:8s}{best(lambda: keyfold._take(data.column(c), slots))[0]:6.1f}")
    print(f"  chunked   {best(lambda: pc.take(data.column(c), slots))[0]:6.1f}")
    print(f"  combine   {best(lambda: data.column(c).combine_chunks())[0]:6.1f}")
print(f"radix        {best(lambda: keyfold._radix_order(kk))[0]:6.1f}")
def pt_parts():
    ops = keyfold._joined([t.column(keytables.OP) for _, t in live])
    return pc.min_max(ops)
print(f"pt ops joined {best(pt_parts)[0]:6.1f}")
def ends():
    def end(t, at):
        return t.column('k').slice(at, 1).combine_chunks()
    firsts = pa.concat_arrays([end(t, 0) for _, t in live])
    lasts = pa.concat_arrays([end(t, t.num_rows - 1) for _, t in live])
    by_key = pc.sort_indices(firsts)
    return pc.take(firsts, by_key), pc.take(lasts, by_key)
print(f"pt ends      {best(ends)[0]:6.1f}")
