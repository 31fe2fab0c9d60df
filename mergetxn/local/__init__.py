"""The embedded cluster: a local ZooKeeper from the pyspark jars and replica processes."""
