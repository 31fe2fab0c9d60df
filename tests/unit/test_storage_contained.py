"""``Storage.contained`` (parts/io/storage.py): whether a part's file is inside the storage root
once links are followed (its directories and, where it exists, the file itself). It takes a cheap road (an ``lstat`` per directory below the root)
when no link is on the way and realpath otherwise: every layout below must get the answer that
realpath alone gives, links out of the root refused. Real directories and links under tmp_path."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from coordinator.core.errors import InvalidInput
from parts.io.storage import Storage

PART = "t/p=x/part-1.parquet"


def by_realpath(root: Path, relpath: str) -> bool:
    """The reference: the realpath of the part's file under the root's realpath."""
    real = os.path.realpath(root)
    return os.path.realpath(os.path.join(root, relpath)).startswith(real + os.sep)


def plain(root: Path, outside: Path) -> None:
    (root / "t" / "p=x").mkdir(parents=True)


def nothing(root: Path, outside: Path) -> None:
    """No directory yet (a part not written): lexically inside, as realpath says."""


def table_only(root: Path, outside: Path) -> None:
    (root / "t").mkdir()


def partition_links_out(root: Path, outside: Path) -> None:
    (root / "t").mkdir()
    os.symlink(outside, root / "t" / "p=x")


def table_links_out(root: Path, outside: Path) -> None:
    os.symlink(outside, root / "t")
    (outside / "p=x").mkdir()


def partition_links_inside(root: Path, outside: Path) -> None:
    (root / "t" / "real").mkdir(parents=True)
    os.symlink(root / "t" / "real", root / "t" / "p=x")


def relative_link_up_and_out(root: Path, outside: Path) -> None:
    (root / "t").mkdir()
    os.symlink(os.path.relpath(outside, root / "t"), root / "t" / "p=x")


def dangling_link(root: Path, outside: Path) -> None:
    (root / "t").mkdir()
    os.symlink(outside / "gone", root / "t" / "p=x")


def file_for_a_directory(root: Path, outside: Path) -> None:
    (root / "t").mkdir()
    (root / "t" / "p=x").write_bytes(b"")


def file_links_out(root: Path, outside: Path) -> None:
    """The part's file itself a link to a file outside (read at stage time, it would be that file)."""
    (root / "t" / "p=x").mkdir(parents=True)
    (outside / "secret").write_bytes(b"not a part")
    os.symlink(outside / "secret", root / PART)


def file_links_inside(root: Path, outside: Path) -> None:
    (root / "t" / "p=x").mkdir(parents=True)
    (root / "t" / "other.parquet").write_bytes(b"PAR1")
    os.symlink(root / "t" / "other.parquet", root / PART)


def plain_file(root: Path, outside: Path) -> None:
    (root / "t" / "p=x").mkdir(parents=True)
    (root / PART).write_bytes(b"PAR1")


def link_to_a_link_out(root: Path, outside: Path) -> None:
    (root / "t").mkdir()
    os.symlink(outside, root / "hop")
    os.symlink(root / "hop", root / "t" / "p=x")


LAYOUTS: list[tuple[Callable[[Path, Path], None], bool]] = [
    (plain, True),
    (nothing, True),
    (table_only, True),
    (partition_links_out, False),
    (table_links_out, False),
    (partition_links_inside, True),
    (relative_link_up_and_out, False),
    (dangling_link, False),
    (file_for_a_directory, True),
    (link_to_a_link_out, False),
    (file_links_out, False),
    (file_links_inside, True),
    (plain_file, True),
]


@pytest.mark.parametrize("root_through_a_link", [False, True])
@pytest.mark.parametrize(("layout", "inside"), LAYOUTS, ids=[f.__name__ for f, _ in LAYOUTS])
def test_contained_agrees_with_realpath(
    tmp_path: Path, layout: Callable[[Path, Path], None], inside: bool, root_through_a_link: bool
) -> None:
    real_root = tmp_path / "store"
    real_root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    root = real_root
    if root_through_a_link:  # the operator's root may itself be reached through a link
        root = tmp_path / "store_link"
        os.symlink(real_root, root)
    layout(real_root, outside)
    storage = Storage(str(root))
    assert storage.contained(PART) is inside
    assert by_realpath(root, PART) is inside
    assert storage.contained("top.parquet") is True  # a file directly in the root


@pytest.mark.parametrize("bad", ["../x.parquet", "t/../../x.parquet", "/etc/x.parquet", "t//x.parquet", "t/./x"])
def test_contained_refuses_paths_that_are_not_relative_and_plain(tmp_path: Path, bad: str) -> None:
    with pytest.raises(InvalidInput):
        Storage(str(tmp_path)).contained(bad)
