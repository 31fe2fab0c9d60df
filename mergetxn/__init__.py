"""The tools on top of the layers: what an operator or a test runs.

``mergetxn.cli`` (the ``mergetxn`` command), ``mergetxn.quickstart`` (the main job on the embedded
default), ``mergetxn.cluster`` (``LocalCluster``: ZooKeeper and replica processes on this machine,
also ``coordinator.LocalCluster``) and ``mergetxn.zkserver`` (an embedded ZooKeeper server or
ensemble from the jars in the pyspark wheel). Nothing below imports them.
"""
