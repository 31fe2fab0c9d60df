"""Summarize commit_throughput.py --profile-kind mergetxn3_* JSON files: CPU per commit, per thread, requests per log entry."""

import json
import sys

for f in sys.argv[1:]:
    r = json.load(open(f))
    reps = r["per_replica"]
    ent = sum(p["zookeeper_requests_per_commit"].get("Transaction", 0) for p in reps)
    cpu = r["cpu_ms_per_commit"]
    tot = sum(cpu.values())

    def avg(key, sub):
        return sum(p[key].get(sub, 0) for p in reps) / len(reps)

    th = {k: avg("thread_cpu_ms_per_commit", k) for k in ("committer", "follower", "rpc", "(zk_loop)", "maintenance")}
    rq = {k: avg("zookeeper_requests_per_commit", k) for k in ("GetData", "Exists", "GetChildren", "Transaction")}
    tm = {}
    for k in (
        "ReplicaState.wait_versions [wall]",
        "Wal._write [wall]",
        "Follower._pull",
        "Follower._pull [wall]",
        "Committer._commit_batch [wall]",
    ):
        v = [p["timers"].get(k) for p in reps if p["timers"].get(k)]
        if v:
            tm[k] = round(sum(x["cpu_ms_per_commit"] for x in v) / len(v), 3)
    print(
        f"{f.split('/')[-1]:14s} {r['commits_per_s']:6.1f}/s load {r['load_avg_1m_after']:5.1f} oth {r['other_cpu_share']:.2f} entries/commit {ent:.3f} "
        f"ZK {cpu['zookeeper']:.2f} repl {sum(v for k, v in cpu.items() if k.startswith('replica')) / 3:.2f} wr {cpu['writers']:.2f} tot {tot:.2f}"
    )
    print(
        "   thr/replica "
        + " ".join(f"{k}={v:.3f}" for k, v in th.items())
        + " | per entry per replica: "
        + " ".join(f"{k}={v / ent:.2f}" for k, v in rq.items() if k != "Transaction")
        + f" | ZK ms/entry {cpu['zookeeper'] / ent:.2f} | mntr pkts/commit {r['zookeeper_mntr_per_commit'].get('zk_packets_received', 0):.2f}"
    )
    if tm:
        print("   timers(ms/commit, wall where marked) ", tm)
