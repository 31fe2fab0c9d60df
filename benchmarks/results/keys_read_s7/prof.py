"""In-process profile of one whole read of issue 24's keys table, per phase (wall and CPU of this
process, all threads), best of ROUNDS, alternating keys / parts. Run with PYTHONPATH = the tree.
Optional: OLD=<tree> also times that tree's keyfold.merge on the same decoded versions."""
import importlib.util
import os
import random
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(os.environ["PYTHONPATH"].split(":")[0])
os.chdir(ROOT)
sys.path.insert(0, str(ROOT / "benchmarks"))
import pyarrow as pa  # noqa: E402

from coordinator.core import keyfold, keytables  # noqa: E402
from mergetxn.local.cluster import LocalCluster  # noqa: E402
from parts.io import keyscan  # noqa: E402
from parts.model.meta import PartMeta  # noqa: E402
import keys_bench as kb  # noqa: E402

N = int(os.environ.get("KEYS", "1000000"))
ROUNDS = int(os.environ.get("ROUNDS", "7"))
old_merge = None
if os.environ.get("OLD"):
    spec = importlib.util.spec_from_file_location("old_keyfold", Path(os.environ["OLD"]) / "coordinator/core/keyfold.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules['old_keyfold'] = mod
    spec.loader.exec_module(mod)
    old_merge = mod.merge


def timed(f):
    w, c = time.perf_counter(), time.process_time()
    out = f()
    return (time.perf_counter() - w) * 1e3, (time.process_time() - c) * 1e3, out


def load(client):
    keys_t, parts_t = "kv_read", "parts_read"
    client.create_table(keys_t, kb.SCHEMA, primary_key=("k",), conflict_policy="keys", auto_merge=False)
    client.create_table(parts_t, kb.SCHEMA, conflict_policy="parts", auto_merge=False)
    rng = random.Random(3)
    order = list(range(N))
    rng.shuffle(order)
    per = N // 100
    for i in range(100):
        batch = order[i * per : (i + 1) * per]
        for table in (keys_t, parts_t):
            with client.transaction() as tx:
                (tx.upsert if table == keys_t else tx.insert)(table, kb.rows(batch, 0))
    for r in range(20):
        with client.transaction() as tx:
            tx.upsert(keys_t, kb.rows(sorted(rng.sample(range(N), N // 100)), r + 1))
    return keys_t, parts_t


def phases(client, table):
    w0, c0 = time.perf_counter(), time.process_time()
    r = client.call("visible", table=table, slim=True, lease="none")
    t_vis = (time.perf_counter() - w0) * 1e3
    metas = [PartMeta.from_dict(m) for m in r["parts"]]
    t_meta = (time.perf_counter() - w0) * 1e3 - t_vis
    tdef = client._table_at(table, r["snapshot"], r.get("ddl"))
    csns = r.get("csns") or {}
    pk = tuple(tdef.primary_key)
    orders = [csns.get(m.name, keytables.OWN) for m in metas]
    stats = [m.stats for m in metas]
    shared, alone = keyfold.shared_orders(orders, stats), keyfold.alone(pk[0], stats)
    plans = [keyfold.read_plan(tdef.schema, pk, *how, None) for how in zip(stats, shared, alone)]

    def decode():
        with ThreadPoolExecutor(max_workers=min(8, len(metas))) as pool:
            return list(pool.map(lambda mp: keyscan.read_versions(client.storage, *mp, pk), zip(metas, plans)))

    def decodeW(w):
        with ThreadPoolExecutor(max_workers=w) as pool:
            return list(pool.map(lambda mp: keyscan.read_versions(client.storage, *mp, pk), zip(metas, plans)))

    def decode1():
        return [keyscan.read_versions(client.storage, m, p, pk) for m, p in zip(metas, plans)]

    dw, dc, datas = timed(decode)
    d1w, d1c, _ = timed(decode1)
    d2 = timed(lambda: decodeW(2))[:2]
    d4 = timed(lambda: decodeW(4))[:2]
    parts = list(zip(orders, datas))
    if os.environ.get("DEBUG"):
        live = keyfold._in_csn_order(parts)
        print("rising", all(keyfold._rising([t.column("k") for _, t in live])), "distinct", len({o for o, _ in live}), len(live),
              "ver", [t.column_names for _, t in live][:2], [t.schema for _, t in live][:1], "orders", orders[:5])
        data = keyfold._versions(tdef.schema, live)
        print("slot", keyfold._last_by_slot(data.column("k")) is not None, data.schema)
        slots = keyfold._last_by_slot(data.column("k"))
        for name, f in (("versions", lambda: keyfold._versions(tdef.schema, live)), ("slot", lambda: keyfold._last_by_slot(data.column("k"))),
                        ("rising", lambda: keyfold._rising([t.column("k") for _, t in live])), ("passed", lambda: keyfold._passed_through(tdef.schema, "k", live)),
                        ("take k", lambda: keyfold._take(data.column("k"), slots)), ("take v", lambda: keyfold._take(data.column("v"), slots)), ("take s", lambda: keyfold._take(data.column("s"), slots)),
                        ("merge", lambda: keyfold.merge(tdef.schema, pk, parts)), ("merge", lambda: keyfold.merge(tdef.schema, pk, parts))):
            print(name, timed(f)[:2])
    mw, mc, out = timed(lambda: keyfold.merge(tdef.schema, pk, parts))
    res = {"visible": t_vis, "meta": t_meta, "decode8": (dw, dc), "decode1": (d1w, d1c), "decode2": d2, "decode4": d4, "merge": (mw, mc)}
    if old_merge is not None:
        ow, oc, old = timed(lambda: old_merge(tdef.schema, pk, parts))
        assert old.equals(out)
        res["old_merge"] = (ow, oc)
    return res, out.num_rows


def main():
    with tempfile.TemporaryDirectory(prefix="ks7-") as work, LocalCluster(Path(work) / "c", replicas=1) as cluster:
        client = cluster.client(0)
        t0 = time.time()
        keys_t, parts_t = load(client)
        print(f"loaded in {time.time() - t0:.1f} s; {os.getloadavg()}", flush=True)
        for label in ("120 parts", "after major compaction"):
            best = {}
            for _ in range(ROUNDS):
                kw, kc, got = timed(lambda: client.read(keys_t))
                assert got.num_rows == N
                pw, pc_, got = timed(lambda: client.read(parts_t))
                assert got.num_rows == N
                ph, _ = phases(client, keys_t)
                for k, v in {"keys read": (kw, kc), "parts read": (pw, pc_), **ph}.items():
                    v = v if isinstance(v, tuple) else (v, 0.0)
                    if k not in best or v[0] < best[k][0]:
                        best[k] = v
            print(f"== {label} (best of {ROUNDS} by wall; load {os.getloadavg()[0]:.2f})")
            for k, (w, c) in best.items():
                print(f"  {k:14s} wall {w:7.1f} ms  cpu {c:7.1f} ms")
            print(f"  keys / parts: wall {best['keys read'][0] / best['parts read'][0]:.2f}x, "
                  f"cpu {best['keys read'][1] / best['parts read'][1]:.2f}x", flush=True)
            if label == "120 parts":
                client.compact(keys_t, kind="major")
        client.close()


main()
