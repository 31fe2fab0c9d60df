"""Alternating probe: the replica's CPU per commit, client.insert 1w and commit_parts 16c, old/new trees."""

import json
import os
import subprocess
import sys
import time

trees = {"old": "/work/wt-replicacut-base", "new": "/work/wt-replicacut"}
code = r"""
import json, shutil, sys
from pathlib import Path
sys.path.insert(0, "benchmarks")
import commit_throughput as ct
from mergetxn.local.zkserver import ZooKeeperServer
work = Path(sys.argv[1]); shutil.rmtree(work, ignore_errors=True); work.mkdir(parents=True)
zk = ZooKeeperServer(work / "zk"); zk.start()
try:
    r = ct.bench_mergetxn(work / "cluster", zk.address, zk.pid, 1, "/probe",
        [("insert_call_1w", "mergetxn_insert_call", 1, False), ("commit_parts_16c", "mergetxn_commit_parts", 16, False)],
        2.0, float(sys.argv[2]), lambda m: None)
finally:
    zk.stop(); shutil.rmtree(work, ignore_errors=True)
print("RESULT " + json.dumps(r))
"""
rounds = int(sys.argv[1])
secs = sys.argv[2]
out = []
for i in range(rounds):
    for label in ("old", "new") if i % 2 == 0 else ("new", "old"):
        tree = trees[label]
        load = os.getloadavg()[0]
        p = subprocess.run(
            [sys.executable, "-c", code, f"/tmp/rc/probe-{label}", secs],
            cwd=tree,
            env={**os.environ, "PYTHONPATH": tree},
            capture_output=True,
            text=True,
        )
        line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
        if not line:
            print(label, "failed", p.stderr[-2000:])
            continue
        r = json.loads(line[0][7:])
        row = {"round": i, "tree": label, "load": round(load, 1), "time": time.strftime("%H:%M:%S")}
        for case, v in r.items():
            row[case] = {
                "rate": v.get("commits_per_s"),
                "cpu": v.get("cpu_ms_per_commit"),
                "other": v.get("other_cpu_share"),
            }
        print(json.dumps(row), flush=True)
        out.append(row)
json.dump(out, open("/tmp/rc/probe.json", "w"), indent=1)
