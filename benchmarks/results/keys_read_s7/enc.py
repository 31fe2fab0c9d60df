exec(open('/tmp/keysread7/dec.py').read().split("kraws =")[0])
import time
def best(f, R=7):
    b = 1e9
    for _ in range(R):
        c = time.process_time(); out = f(); b = min(b, time.process_time() - c)
    return round(b * 1e3, 1), out
vs = [fmt._sorted_by_key(keytables.versions(schema, ("k",), "t", b, keytables.PUT, 0), ("k",)) for b in batches]
def write(t, **kw):
    sink = pa.BufferOutputStream()
    pq.write_table(t, sink, compression="zstd", write_statistics=True, row_group_size=8192, **kw)
    return sink.getvalue()
variants = {
    "dict (now)": dict(use_dictionary=True),
    "k plain": dict(use_dictionary=["v", "s", "_op", "_seq", "_cols"]),
    "k delta": dict(use_dictionary=["v", "s", "_op", "_cols"], column_encoding={"k": "DELTA_BINARY_PACKED", "_seq": "DELTA_BINARY_PACKED"}),
}
for rnd in range(2):
    for name, kw in variants.items():
        raws = [write(t, **kw) for t in vs]
        pfs = [pq.ParquetFile(pa.BufferReader(r)) for r in raws]
        t1, _ = best(lambda: [p.read(columns=["k"], use_threads=False) for p in pfs])
        t2, _ = best(lambda: [p.read(columns=["k", "v", "s"], use_threads=False) for p in pfs])
        print(f"{name:12s} k {t1:6.1f}  kvs {t2:6.1f}  bytes {sum(len(r) for r in raws)}")
