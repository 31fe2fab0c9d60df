import sys, time
sys.path.insert(0, "tests")
from support.builders import change, entry, part, table_def, tid
from coordinator.core.conflicts import Kind
from replicas.state import ReplicaState
st = ReplicaState()
st.apply(1, 0, 0, entry(ddl=[table_def("t")], versions={"t": 0}))
live = []
csn = 1
for n in range(100_000):
    csn += 1
    name = f"p{n:06d}"
    removed = []
    if len(live) >= 8:
        removed, live = live, []
    live.append(name)
    st.apply(csn, 0, csn - 1, entry((tid(n + 10), [change("t", (1,), [Kind.INSERT], added=[part(name, partition=(1,), creator=tid(n+10))], removed=removed)])))
print("records", len(st.parts))
t0 = time.perf_counter()
for _ in range(50):
    st.visible("t", st.applied - 3, tid(10**7), [], set(), ["[1]"])
print(f"visible at applied-3 with pkeys: {(time.perf_counter()-t0)/50*1e3:.3f} ms")
import gc
t0 = time.perf_counter(); gc.collect(); print(f"full gc: {(time.perf_counter()-t0)*1e3:.1f} ms, tracked {len(gc.get_objects())}")
from replicas import checkpoint
t0 = time.perf_counter(); payload = st.export(); t1 = time.perf_counter(); b = checkpoint.encode(payload); t2 = time.perf_counter()
print(f"export {(t1-t0)*1e3:.0f} ms, encode {(t2-t1)*1e3:.0f} ms, {len(b)} bytes")
t0 = time.perf_counter(); c = st.removed_after(0); c.sort(key=lambda r: (r.removal_csn, r.meta.name)); print(f"removed_after+sort {(time.perf_counter()-t0)*1e3:.0f} ms {len(c)}")
