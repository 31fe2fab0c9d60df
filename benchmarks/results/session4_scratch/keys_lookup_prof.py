"""Per-phase profile of point lookups (client wall per phase, replica CPU per lookup)."""
import os, sys, time, random, statistics, tempfile, cProfile, pstats, io
from pathlib import Path
ROOT = Path(os.environ["MERGETXN_CODE"]); sys.path.insert(0, str(ROOT)); os.chdir(ROOT)
sys.path.insert(0, "/tmp/kl")
import keys_bench as kb
import pyarrow.compute as pc
from mergetxn.local.cluster import LocalCluster
import coordinator.api.client as cm
from coordinator.core import keyfold

N, P, L = int(os.environ.get("N", 1_000_000)), int(os.environ.get("P", 1000)), int(os.environ.get("L", 300))
phase = {}
def timed(name, f):
    def w(*a, **k):
        t0 = time.perf_counter()
        try: return f(*a, **k)
        finally: phase.setdefault(name, []).append(time.perf_counter() - t0)
    return w
def cpu(pid):
    with open(f"/proc/{pid}/stat") as fh: f = fh.read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
with tempfile.TemporaryDirectory(prefix="kl-") as work, LocalCluster(Path(work) / "c", replicas=1) as cluster:
    client = cluster.client(0)
    kb.load_keys(client, N, P, print)
    time.sleep(15)  # let merges settle
    pid = cluster.replica_pid(0)
    rng = random.Random(1)
    for _ in range(30):
        client.read("kv", where=pc.field("k") == rng.randrange(N))
    real_call = client.call
    def call(action, **a):
        t0 = time.perf_counter()
        try: return real_call(action, **a)
        finally: phase.setdefault("rpc " + action, []).append(time.perf_counter() - t0)
    client.call = call
    cm.read_part = timed("read_part", cm.read_part)
    keyfold.merge = timed("keyfold.merge", keyfold.merge)
    cm.keytables.point_hint = timed("point_hint", cm.keytables.point_hint)
    cm.keytables.point_keys = timed("point_keys", cm.keytables.point_keys)
    tot = []
    c0, w0 = cpu(pid), time.process_time()
    for _ in range(L):
        key = rng.randrange(N)
        t0 = time.perf_counter()
        got = client.read("kv", where=pc.field("k") == key)
        tot.append(time.perf_counter() - t0)
        assert got.num_rows == 1
    c1, w1 = cpu(pid), time.process_time()
    print(os.popen("uptime").read().strip())
    print(f"total p50 {statistics.median(tot)*1e3:.2f} ms mean {statistics.mean(tot)*1e3:.2f}; client CPU {(w1-w0)/L*1e3:.2f} ms/lookup; replica CPU {(c1-c0)/L*1e3:.2f} ms/lookup")
    for k, v in sorted(phase.items()):
        print(f"  {k:20s} n/lookup {len(v)/L:.2f}  p50 {statistics.median(v)*1e3:.3f} ms  mean*n {sum(v)/L*1e3:.3f} ms")
    # ping RPC cost
    pt = []
    for _ in range(100):
        t0 = time.perf_counter(); real_call("snapshot"); pt.append(time.perf_counter() - t0)
    print(f"  rpc snapshot (ping) p50 {statistics.median(pt)*1e3:.3f} ms")
    pr = cProfile.Profile(); pr.enable()
    for _ in range(100):
        client.read("kv", where=pc.field("k") == rng.randrange(N))
    pr.disable()
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(45); print(s.getvalue()[:9000])
    metas = [m for m in []]
    client.close()
