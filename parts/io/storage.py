"""Where part files live: a local directory (the default) or any fsspec URL (``s3://`` through
s3fs, ``memory://`` for tests).

Parts are immutable and are only ever written whole, so the store needs just whole-object
operations. ``put`` is atomic and durable on every backend, because a commit in ZooKeeper may
reference a part the moment ``put`` returns and no reader may ever see half a file: locally it
writes a temporary file, fsyncs it, renames it into place and fsyncs the directory; an object
store makes a single PUT visible all at once. A part's file, whose name is fresh and read by no
one before a commit names it, is created at that name instead (``put(..., fresh=True)``): the
file and its directory fsynced, one rename less.

Credentials given in ``options`` (or taken from the AWS environment variables) never appear in
``repr``/``str`` or in the messages of errors raised here.
"""

from __future__ import annotations

import builtins
import datetime as _dt
import os
import re
import socket
import stat
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from coordinator.core.errors import InvalidInput, StorageError, storage_error

_T = TypeVar("_T")
_SECRET_WORDS = ("secret", "token", "password", "passwd", "key", "credential", "session")
_BAD_SEGMENTS = {"", ".", ".."}
_TMP_MARK = ".tmp-"


def _validate_relpath(relpath: str, *, allow_empty: bool = False) -> str:
    """Reject paths that could escape the storage root or differ between backends."""
    if not isinstance(relpath, str):
        raise InvalidInput(f"storage path must be a string, got {type(relpath).__name__}")
    if relpath == "" and allow_empty:
        return relpath
    if relpath == "":
        raise InvalidInput("storage path is empty")
    if relpath.startswith("/"):
        raise InvalidInput(f"storage path {relpath!r} must be relative (leading '/')")
    if "\\" in relpath or "\x00" in relpath:
        raise InvalidInput(f"storage path {relpath!r} contains '\\' or NUL")
    segments = relpath.split("/")
    if allow_empty and segments[-1] == "":
        segments = segments[:-1]
    if not _BAD_SEGMENTS.isdisjoint(segments):
        raise InvalidInput(f"storage path {relpath!r} has an empty, '.' or '..' component")
    return relpath


def _display_url(url: str) -> str:
    """The URL without any user:password part, safe to print."""
    parts = urlsplit(url)
    if parts.scheme and "@" in parts.netloc:
        host = parts.netloc.rsplit("@", 1)[1]
        return urlunsplit((parts.scheme, f"***@{host}", parts.path, parts.query, parts.fragment))
    return url


def _collect_secrets(options: Any, out: set[str], sensitive: bool = False) -> None:
    if isinstance(options, dict):
        for k, v in options.items():
            name = str(k).lower()
            _collect_secrets(v, out, sensitive or any(w in name for w in _SECRET_WORDS))
    elif isinstance(options, (list, tuple)):
        for v in options:
            _collect_secrets(v, out, sensitive)
    elif sensitive and isinstance(options, (str, bytes)) and len(options) > 0:
        out.add(options.decode("utf-8", "replace") if isinstance(options, bytes) else options)


def s3_env_options() -> dict[str, Any]:
    """s3fs options from the usual AWS variables (used when no options were given)."""
    opts: dict[str, Any] = {}
    env = os.environ
    if env.get("AWS_ACCESS_KEY_ID"):
        opts["key"] = env["AWS_ACCESS_KEY_ID"]
    if env.get("AWS_SECRET_ACCESS_KEY"):
        opts["secret"] = env["AWS_SECRET_ACCESS_KEY"]
    if env.get("AWS_SESSION_TOKEN"):
        opts["token"] = env["AWS_SESSION_TOKEN"]
    endpoint = env.get("AWS_ENDPOINT_URL") or env.get("MERGETXN_S3_ENDPOINT")
    if endpoint:
        opts["endpoint_url"] = endpoint
    return opts


class Storage:
    """A root under which parts are stored, addressed by '/'-separated relative paths."""

    def __init__(self, url: str, options: dict | None = None) -> None:
        if not isinstance(url, str) or not url.strip():
            raise InvalidInput("storage url must be a non-empty string")
        if options is not None and not isinstance(options, dict):
            raise InvalidInput(f"storage options must be a dict, got {type(options).__name__}")
        self._url = url
        scheme = urlsplit(url).scheme.lower() if "://" in url else ""
        if scheme in ("s3", "s3a") and options is None:
            options = s3_env_options()
        self._options: dict[str, Any] = dict(options or {})
        self._secrets: set[str] = set()
        _collect_secrets(self._options, self._secrets)
        self._fs: Any = None
        self._root: str
        self._real_root: str | None = None  # the local root with links resolved (contained())
        if scheme in ("", "file", "local"):
            self._root = self._init_local(url, scheme)
        else:
            self._root = self._init_fsspec(url, scheme)

    def _init_local(self, url: str, scheme: str) -> str:
        path = urlsplit(url).path if scheme in ("file", "local") else url
        root = os.path.abspath(os.path.expanduser(path))
        try:
            os.makedirs(root, exist_ok=True)
        except OSError as exc:
            raise InvalidInput(f"storage {self._safe_url}: cannot create directory: {exc.strerror or exc}") from None
        if not os.access(root, os.W_OK | os.X_OK):
            raise InvalidInput(f"storage {self._safe_url}: directory is not writable")
        return root

    def _init_fsspec(self, url: str, scheme: str) -> str:
        import fsspec

        options = dict(self._options)
        if scheme in ("s3", "s3a"):
            options.setdefault("use_listings_cache", False)
        try:
            fs, root = fsspec.core.url_to_fs(url, **options)
        except (ValueError, ImportError, TypeError) as exc:
            raise InvalidInput(f"storage {self._safe_url}: unsupported url or options ({self._why(exc)})") from None
        root = root.rstrip("/")
        if scheme in ("s3", "s3a"):
            bucket = root.split("/", 1)[0]
            if not bucket:
                raise InvalidInput(f"storage {self._safe_url}: no bucket in url")
            self._check_endpoint(options)
            probe = bucket
        else:
            probe = root
        if scheme in ("s3", "s3a"):
            # Not fs.exists: s3fs answers False for any error, so an S3 outage would read as a
            # missing bucket (bad input) and a replica restarted during it would give up.
            try:
                fs.invalidate_cache(probe)
                fs.info(probe)
            except FileNotFoundError:
                raise InvalidInput(
                    f"storage {self._safe_url}: bucket {probe!r} does not exist or is not accessible"
                ) from None
            except (PermissionError, TypeError, ValueError) as exc:  # credentials, options
                raise InvalidInput(
                    f"storage {self._safe_url}: bucket {probe!r} is not accessible ({self._why(exc)})"
                ) from None
            except Exception as exc:  # an outage: a StorageError (an OSError too), never bad input
                raise StorageError(
                    f"storage {self._safe_url} is unreachable ({self._why(exc)})",
                    path=probe,
                    op="open",
                    reason=self._why(exc),
                    errno=None,
                ) from None
        else:
            try:
                fs.exists(probe)
            except Exception as exc:
                raise InvalidInput(f"storage {self._safe_url} is unreachable ({self._why(exc)})") from None
        self._fs = fs
        return root

    def _check_endpoint(self, options: dict[str, Any]) -> None:
        """Fail fast and clearly when a configured endpoint does not accept connections (the
        S3 client would otherwise retry for many seconds and report a missing bucket)."""
        endpoint = options.get("endpoint_url") or (options.get("client_kwargs") or {}).get("endpoint_url")
        if not endpoint:
            return
        parts = urlsplit(endpoint)
        if not parts.hostname:
            shown = self._redact(_display_url(str(endpoint)))
            raise InvalidInput(f"storage {self._safe_url}: endpoint {shown!r} has no host")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            socket.create_connection((parts.hostname, port), timeout=5).close()
        except OSError as exc:
            raise InvalidInput(
                f"storage {self._safe_url}: endpoint {self._redact(_display_url(endpoint))} "
                f"is unreachable ({self._why(exc)})"
            ) from None

    @property
    def _safe_url(self) -> str:
        return self._redact(_display_url(self._url))

    def _redact(self, text: str) -> str:
        for secret in sorted(self._secrets, key=len, reverse=True):
            text = text.replace(secret, "***")
        return text

    def _why(self, exc: BaseException) -> str:
        return f"{type(exc).__name__}: {self._redact(str(exc))}"

    def __repr__(self) -> str:
        return f"Storage({self._safe_url!r})"

    __str__ = __repr__

    def __reduce__(self) -> tuple[Any, ...]:
        """Rebuild from url and options (e.g. on a Spark executor), not from the client."""
        return (type(self), (self._url, self._options))

    @property
    def url(self) -> str:
        """The URL (or directory) this storage was opened with, credentials masked."""
        return _display_url(self._url)

    @property
    def is_local(self) -> bool:
        """True when files live in a local directory (fsync-based durability)."""
        return self._fs is None

    def arrow_filesystem(self) -> Any:
        """This storage as a ``pyarrow.fs.FileSystem`` (for ``pyarrow.dataset`` and the engines
        that scan one): the local file system, or the fsspec one (s3fs) wrapped for Arrow, with
        the same credentials. Paths on it: :meth:`arrow_path`."""
        import pyarrow.fs as pafs

        if self._fs is None:
            return pafs.LocalFileSystem()
        return pafs.PyFileSystem(pafs.FSSpecHandler(self._fs))

    def arrow_path(self, relpath: str) -> str:
        """Where ``relpath`` is on :meth:`arrow_filesystem`."""
        return self._local(relpath) if self._fs is None else self._remote(relpath)

    def _local(self, relpath: str) -> str:
        # os.path.join(root, *segments) for segments that are none empty nor absolute (checked)
        root = self._root
        return (root if not root or root.endswith("/") else root + "/") + _validate_relpath(relpath)

    def contained(self, relpath: str) -> bool:
        """Whether ``relpath`` names a file inside the storage root once symbolic links are
        followed (a link in a table's directory pointing elsewhere makes it False). Object stores
        have no links: always True there."""
        if self._fs is not None:
            _validate_relpath(relpath)
            return True
        segments = _validate_relpath(relpath).split("/")
        # The common case, cheaply: every directory from the root down to the file's is a real
        # directory and the file (if there) is no link (lstat). The path has no '.', '..' or empty
        # segment, so it is then inside the root, as realpath would say, for a `lstat` per segment
        # below the root instead of realpath's per component of the whole absolute path. A link, a
        # missing directory or anything else takes the realpath road, which decides as before. A
        # file that is a link is followed too: a part's file is read at stage time, and a link
        # would hand the replica (and its answer) a file outside the root.
        path = self._root
        for seg in segments[:-1]:
            path = path + os.sep + seg
            try:
                if not stat.S_ISDIR(os.lstat(path).st_mode):
                    break
            except OSError:
                break
        else:
            try:
                if not stat.S_ISLNK(os.lstat(path + os.sep + segments[-1]).st_mode):
                    return True
            except OSError:
                return True  # no file there (yet): its directory decides, and that is inside
        root = self._real_root
        if root is None:
            root = self._real_root = os.path.realpath(self._root)
        where = os.path.realpath(self._local(relpath))
        return where.startswith(root + os.sep)

    def _remote(self, relpath: str) -> str:
        return f"{self._root}/{_validate_relpath(relpath)}"

    def _remote_op(self, op: str, relpath: str, call: Callable[[str], _T]) -> _T:
        """``call`` on the remote path of ``relpath``; what it raises becomes :meth:`_fail`'s error."""
        path = self._remote(relpath)
        try:
            return call(path)
        except Exception as exc:
            raise self._fail(op, relpath, exc) from None

    def _fail(self, op: str, relpath: str, exc: BaseException) -> OSError:
        if isinstance(exc, FileNotFoundError):
            return FileNotFoundError(f"storage {self._safe_url}: {relpath!r} does not exist")
        if isinstance(exc, OSError) and isinstance(exc.errno, int):
            return storage_error(exc, op, relpath, self._safe_url)
        return StorageError(
            f"storage {self._safe_url}: {op} {relpath!r} failed ({self._why(exc)})",
            path=relpath,
            op=op,
            reason=self._why(exc),
            errno=None,
        )

    def put(self, relpath: str, data: bytes, durable: bool = True, fresh: bool = False) -> None:
        """Store ``data`` at ``relpath`` atomically (visible whole or not at all) and, unless
        ``durable`` is False (advisory files that a crash may lose), durably.

        ``fresh``: ``relpath`` is a name never used before (a part's: 64 random bits) that nothing
        reads until a commit names it, which happens only after this returns. Locally the file is
        then created at its final name (``O_EXCL``) instead of a temporary name and a rename: two
        system calls and a name less per part. A writer that dies mid-way leaves a partial file
        under a name no commit will ever reference, which cleanup collects as an orphan behind its
        fence (replicas/cleanup.py), as it collects a complete one. An existing file there is
        never overwritten (StorageError)."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidInput(f"storage put {relpath!r}: data must be bytes, got {type(data).__name__}")
        if self._fs is None:
            try:
                self._put_local(self._local(relpath), data, durable, fresh)
            except OSError as exc:  # disk full, read-only, no permission: say which and where
                raise storage_error(exc, "put", relpath, self._safe_url) from None
            return
        fs = self._fs
        self._remote_op("put", relpath, lambda path: fs.pipe_file(path, bytes(data)))

    def _put_local(self, path: str, data: bytes | bytearray | memoryview, durable: bool, fresh: bool) -> None:
        directory = os.path.dirname(path)
        target = (
            path if fresh else os.path.join(directory, f".{os.path.basename(path)}{_TMP_MARK}{uuid.uuid4().hex[:12]}")
        )
        fd = self._create(target, directory)
        dir_synced: Future[None] | None = None
        try:
            try:
                _write_all(fd, data)
                if durable and fresh:  # the entry is there already: both fsyncs at once
                    dir_synced = _dir_syncs().submit(_fsync_dir, directory)
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            if not fresh:
                os.replace(target, path)
        except BaseException:
            try:
                os.unlink(target)
            except OSError:
                pass
            raise
        finally:
            if dir_synced is not None:
                dir_synced.result()
        if durable and not fresh:
            _fsync_dir(directory)

    def _create(self, path: str, directory: str) -> int:
        """A new file at ``path`` open for writing (never an existing one: ``O_EXCL``); its
        directories are made (durably) only when the first try finds them missing, so the usual
        put costs no ``stat`` of them."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        try:
            return os.open(path, flags, 0o644)
        except FileNotFoundError:
            self._makedirs_durable(directory)
            return os.open(path, flags, 0o644)

    def _makedirs_durable(self, directory: str) -> None:
        """Create missing directories and fsync each parent so the new entries survive a crash."""
        missing = []
        d = directory
        while not os.path.isdir(d):
            missing.append(d)
            parent = os.path.dirname(d)
            if parent == d:
                break
            d = parent
        for d in reversed(missing):
            try:
                os.mkdir(d)
            except FileExistsError:
                pass
            _fsync_dir(os.path.dirname(d))

    def get(self, relpath: str) -> bytes:
        """The whole content; FileNotFoundError when absent."""
        if self._fs is None:
            with open(self._local(relpath), "rb") as f:
                return f.read()
        return self._remote_op("get", relpath, self._fs.cat_file)

    def get_ranges(self, relpath: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        """The bytes of each ``(offset, length)`` of a file, from one open of it (a point read
        fetches a part's footer, then a row group or two, not the whole file): a range past the
        end comes back short. FileNotFoundError when the file is absent."""
        if self._fs is None:
            fd = os.open(self._local(relpath), os.O_RDONLY)  # no buffered file object: a part's check reads once
            try:
                return [os.pread(fd, n, at) for at, n in ranges]
            finally:
                os.close(fd)
        path = self._remote(relpath)
        try:
            got = self._fs.cat_ranges([path] * len(ranges), [a for a, _ in ranges], [a + n for a, n in ranges])
        except Exception as exc:
            raise self._fail("get", relpath, exc) from None
        for g in got:
            if isinstance(g, BaseException):
                raise self._fail("get", relpath, g)
        return list(got)

    def delete(self, relpath: str) -> None:
        """Remove a file; a missing one is not an error (cleanup may run twice). A local path that
        leads out of the storage root through a symbolic link is refused (InvalidInput)."""
        if self._fs is None:
            if not self.contained(relpath):
                raise InvalidInput(
                    f"storage path {relpath!r} leads out of the storage root through a symbolic link: not deleted",
                    path=relpath,
                )
            try:
                os.unlink(self._local(relpath))
            except FileNotFoundError:
                pass
            return
        path = self._remote(relpath)
        try:
            self._fs.rm_file(path)
        except FileNotFoundError:
            pass
        except Exception as exc:
            raise self._fail("delete", relpath, exc) from None

    def exists(self, relpath: str) -> bool:
        """Whether a file (not a directory) exists at ``relpath``."""
        if self._fs is None:
            return os.path.isfile(self._local(relpath))
        path = self._remote(relpath)
        try:
            self._fs.invalidate_cache(path)
            # Not fs.isfile: s3fs answers False for any error, so an S3 outage would read as
            # "the file is gone" (found by mergetxn chaos's s3-errors fault).
            return self._fs.info(path).get("type") == "file"
        except FileNotFoundError:
            return False
        except Exception as exc:
            raise self._fail("exists", relpath, exc) from None

    def missing(self, relpaths: list[str]) -> list[str]:
        """The paths among ``relpaths`` that name no file: a stat each, remote ones concurrently
        (a commit verifies its staged files with it, see coordinator/zk/orphan_fence.py)."""
        if self._fs is None:
            return [p for p in relpaths if not os.path.isfile(self._local(p))]
        if len(relpaths) <= 1:
            return [p for p in relpaths if not self.exists(p)]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(16, len(relpaths))) as pool:
            found = list(pool.map(self.exists, relpaths))
        return [p for p, ok in zip(relpaths, found) if not ok]

    def list(self, prefix: str = "") -> list[str]:
        """Relative paths of all files whose path starts with ``prefix``, recursively, sorted."""
        _validate_relpath(prefix, allow_empty=True)
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        if self._fs is None:
            return self._list_local(prefix, base)
        return sorted(rel for rel, _ in self._find_remote(prefix, base))

    def _find_remote(self, prefix: str, base: str) -> builtins.list[tuple[str, dict]]:
        """(relative path, fsspec info) of the remote files under ``prefix``."""
        start = f"{self._root}/{base}".rstrip("/") if base else self._root
        try:
            self._fs.invalidate_cache()
            found = self._fs.find(start, withdirs=False, detail=True)
        except FileNotFoundError:
            return []
        except Exception as exc:
            raise self._fail("list", prefix, exc) from None
        root = self._root.rstrip("/") + "/"
        out = []
        for p, info in found.items():
            p = p.lstrip("/") if not root.startswith("/") else p
            if not p.startswith(root) or p.endswith("/"):
                continue
            rel = p[len(root) :]
            if rel.startswith(prefix):
                out.append((rel, info))
        return out

    def list_with_mtime(
        self, prefix: str = "", want: Callable[[str], bool] | None = None
    ) -> builtins.list[tuple[str, float]]:
        """``(relative path, mtime)`` of the files under ``prefix`` that ``want`` (given the
        relative path) selects, sorted by path.

        The cleanup pass judges unreferenced files by age: locally only the files it wants are
        stat'ed; on S3 the mtimes come with the object listing instead of a HEAD request each."""
        _validate_relpath(prefix, allow_empty=True)
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        if self._fs is None:
            start = os.path.join(self._root, *base.split("/")) if base else self._root
            out: list[tuple[str, float]] = []
            _scan_local(start, base + "/" if base else "", prefix, want, out)
            out.sort()
            return out
        result = []
        for rel, info in self._find_remote(prefix, base):
            if want is not None and not want(rel):
                continue
            modified = _info_mtime(info)
            if modified is None:
                try:
                    modified = self.mtime(rel)
                except FileNotFoundError:  # deleted since the listing
                    continue
            result.append((rel, modified))
        result.sort()
        return result

    def _list_local(self, prefix: str, base: str) -> builtins.list[str]:
        start = os.path.join(self._root, *base.split("/")) if base else self._root
        out = []
        for dirpath, _dirnames, filenames in os.walk(start):
            rel_dir = os.path.relpath(dirpath, self._root)
            rel_dir = "" if rel_dir == "." else rel_dir.replace(os.sep, "/") + "/"
            for name in filenames:
                rel = rel_dir + name
                if rel.startswith(prefix):
                    out.append(rel)
        return sorted(out)

    def mtime(self, relpath: str) -> float:
        """Last modification time in epoch seconds (garbage collection grace periods)."""
        if self._fs is None:
            return os.stat(self._local(relpath)).st_mtime
        return _epoch(self._remote_op("mtime", relpath, self._fs.modified))

    def size(self, relpath: str) -> int:
        """Size in bytes."""
        if self._fs is None:
            return os.stat(self._local(relpath)).st_size
        return int(self._remote_op("size", relpath, self._fs.size))


def _epoch(modified: Any) -> float:
    if isinstance(modified, _dt.datetime):
        if modified.tzinfo is None:
            modified = modified.replace(tzinfo=_dt.UTC)
        return modified.timestamp()
    return float(modified)


def _info_mtime(info: dict) -> float | None:
    """The modification time an fsspec listing entry carries, if any (local: ``mtime``; s3fs:
    ``LastModified``; gcsfs: ``updated``; adlfs: ``last_modified``)."""
    for key in ("mtime", "LastModified", "last_modified", "updated", "modified"):
        value = info.get(key)
        if value is None:
            continue
        if isinstance(value, str):
            try:
                value = _dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                continue
        try:
            return _epoch(value)
        except (TypeError, ValueError):
            continue
    return None


def _scan_local(
    directory: str, rel_dir: str, prefix: str, want: Callable[[str], bool] | None, out: list[tuple[str, float]]
) -> None:
    try:
        entries = os.scandir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return
    with entries:
        for entry in entries:
            rel = rel_dir + entry.name
            try:
                if entry.is_dir(follow_symlinks=False):
                    if rel.startswith(prefix) or prefix.startswith(rel + "/"):
                        _scan_local(entry.path, rel + "/", prefix, want, out)
                elif rel.startswith(prefix) and (want is None or want(rel)) and entry.is_file():
                    out.append((rel, entry.stat().st_mtime))
            except FileNotFoundError:  # deleted while we looked: not there
                continue


def _write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """``os.write`` until all of ``data`` is written (a write may take only part of it)."""
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view) :]


_DIR_SYNCS: ThreadPoolExecutor | None = None
_DIR_SYNCS_LOCK = threading.Lock()


def _dir_syncs() -> ThreadPoolExecutor:
    """The threads that fsync a fresh file's directory while the writer fsyncs the file: the two
    flushes then overlap (the disk merges them), where one after the other cost a second flush
    per part (measured with benchmarks/latency_timeline.py). Made on first use; a forked child
    makes its own (the parent's threads are not in it)."""
    global _DIR_SYNCS
    with _DIR_SYNCS_LOCK:
        if _DIR_SYNCS is None:
            _DIR_SYNCS = ThreadPoolExecutor(max_workers=8, thread_name_prefix="dir-fsync")
        return _DIR_SYNCS


def _forget_dir_syncs() -> None:
    global _DIR_SYNCS, _DIR_SYNCS_LOCK
    _DIR_SYNCS, _DIR_SYNCS_LOCK = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_dir_syncs)


def _fsync_dir(directory: str) -> None:
    """Persist a directory entry (rename/create); a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def is_temp_file(relpath: str) -> bool:
    """True for leftovers of an interrupted local ``put`` (collectable after a grace period)."""
    name = relpath.rsplit("/", 1)[-1]
    return name.startswith(".") and re.search(re.escape(_TMP_MARK) + r"[0-9a-f]{12}$", name) is not None
