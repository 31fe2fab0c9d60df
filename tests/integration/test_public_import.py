"""One public import (docs/surface.md#one-public-import): ``import mergetxn`` gives the API, each
name the very object it is where it was, and the import itself stays light (the replica processes
and the CLI import the package too)."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pyarrow as pa
import pytest
from support.zk import new_chroot  # tests/ is on sys.path

import coordinator
import coordinator.errors
import mergetxn
import spark
import spark.native
import spark.streaming


def test_the_api_names_are_the_objects_they_are_elsewhere() -> None:
    assert mergetxn.connect is coordinator.connect
    assert mergetxn.LocalCluster is coordinator.LocalCluster
    assert mergetxn.Client is coordinator.Client and mergetxn.Transaction is coordinator.Transaction
    assert mergetxn.Tid is coordinator.Tid
    assert mergetxn.spark.register is spark.register
    assert mergetxn.spark.read_table is spark.native.read_table
    assert mergetxn.spark.write_table is spark.native.write_table
    assert mergetxn.spark.write_stream is spark.streaming.write_stream
    assert set(mergetxn.__all__) >= {"connect", "LocalCluster", "errors", "spark"}


def test_the_errors_are_the_same_classes() -> None:
    from mergetxn.errors import InvalidInput, PermissionDenied

    classes = {
        n: c
        for n, c in vars(coordinator.errors).items()
        if inspect.isclass(c) and issubclass(c, Exception) and c.__module__ == "coordinator.errors"
    }
    assert "MergetxnError" in classes and len(classes) >= 10
    for name, cls in classes.items():
        assert getattr(mergetxn.errors, name) is cls, name
    assert InvalidInput is coordinator.errors.InvalidInput and PermissionDenied is coordinator.errors.PermissionDenied
    with pytest.raises(mergetxn.errors.MergetxnError):
        raise coordinator.errors.TableNotFound("x")


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        _ = mergetxn.nothing
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        _ = mergetxn.spark.nothing


def test_importing_mergetxn_loads_neither_the_client_nor_pyspark() -> None:
    code = (
        "import sys, mergetxn; import mergetxn.cli; "
        "print(sorted(m for m in ('coordinator.client', 'mergetxn.client.client', 'pyspark', 'spark.native') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_a_transaction_through_the_public_import(tmp_path, zk_server) -> None:  # noqa: ANN001
    with mergetxn.LocalCluster(tmp_path, replicas=1, zk_address=new_chroot(zk_server, "pubimport")) as cluster:
        with mergetxn.connect(cluster.replica_addresses[0]) as client:
            client.create_table("t", pa.schema([("id", pa.int64())]))
            with client.transaction() as tx:
                tx.insert("t", pa.table({"id": [1, 2, 3]}))
            assert sorted(client.read("t")["id"].to_pylist()) == [1, 2, 3]
            with pytest.raises(mergetxn.errors.TableNotFound):
                client.read("missing")
