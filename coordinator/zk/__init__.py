"""ZooKeeper: the commit log, its fence, the watermark, alive nodes and the compare-and-swap
recipe, on kazoo."""
