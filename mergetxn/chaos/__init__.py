"""The fault-injection harness: simulated hosts, workloads, nemesis, history, checker, report."""
