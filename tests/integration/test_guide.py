"""The guide (mkdocs.yml, docs/): it builds with ``--strict``, every Python block of its pages runs as
written, and the built site renders with its navigation in a browser.

Python blocks: a page's blocks run in order in one namespace holding ``client`` (a client of its own) and ``cluster`` (this module's),
``mergetxn``, ``pa`` and ``pc``; its tables are dropped afterwards. A
block that starts its own ``LocalCluster("/tmp/mt", ...)`` runs as written in a temporary
directory instead (those pages are slow). A block after ``<!-- engine-snippet -->`` runs in
tests/integration/test_datasets.py; one after ``<!-- not-run: REASON -->`` (Spark, other hosts) is
only compiled.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from support.cluster import make_cluster  # tests/ is on sys.path

import mergetxn
from coordinator import LocalCluster
from mergetxn.client import Client
from mergetxn.local.zkserver import ZooKeeperServer

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# Pages that are the project's records rather than the guide's prose (their blocks, if any, are
# not examples), and the pages others keep.
NOT_GUIDE = {"rules.md", "surface.md", "guarantees.md", "architecture.md", "benchmarks.md"}
BLOCK = re.compile(r"(?:<!-- (engine-snippet|not-run: [^>]*?) -->\n)?```python\n(.*?)```", re.S)
OPTIONAL = {"pandas"}  # a block importing one of these is skipped where it is not installed
OWN_CLUSTER = "LocalCluster("


@dataclass(frozen=True)
class Block:
    page: str
    index: int
    marker: str  # "", "engine-snippet" or "not-run: ..."
    code: str

    @property
    def where(self) -> str:
        return f"{self.page}, Python block {self.index + 1}"


def guide_pages() -> list[Path]:
    """The guide's pages, and README.md (its example runs too)."""
    pages = sorted(DOCS.rglob("*.md"))
    guide = [p for p in pages if p.name not in NOT_GUIDE and "architecture" not in p.relative_to(DOCS).parts]
    return [*guide, ROOT / "README.md"]


def page_name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    name = page_name(page)
    return [Block(name, i, m.group(1) or "", m.group(2)) for i, m in enumerate(BLOCK.finditer(text))]


def runnable_pages() -> list[object]:
    params: list[object] = []
    for page in guide_pages():
        runs = [b for b in blocks(page) if not b.marker]
        if runs:
            slow = any(OWN_CLUSTER in b.code for b in runs)
            marks = [pytest.mark.slow] if slow else []
            params.append(pytest.param(page, marks=marks, id=page_name(page)))
    return params


def test_every_python_block_of_the_guide_compiles_and_says_how_it_runs() -> None:
    """Pure: every block parses; a block not run here is run elsewhere or says why not."""
    found = [b for page in guide_pages() for b in blocks(page)]
    assert len(found) >= 20, "the guide's Python blocks were not found"
    for b in found:
        compile(b.code, b.where, "exec")
        assert b.marker in ("", "engine-snippet") or b.marker.split(":", 1)[1].strip(), b.where
    assert sum(b.marker == "engine-snippet" for b in found) == 5  # test_datasets runs these


def test_the_readme_is_a_short_front_door_whose_links_all_resolve() -> None:
    """Pure: README.md stays at most 150 lines, keeps the two commands CI and users run, and each
    of its relative links names a file of the tree (so they work on GitHub as in the guide)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    assert "./dev quickstart" in text and "./dev test" in text
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    relative = [link for link in links if "://" not in link]
    assert len(relative) >= 20, relative
    missing = [link for link in relative if not (ROOT / link).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"


def test_the_benchmarks_readme_stays_short_and_results_hold_one_file_per_run() -> None:
    """Pure: benchmarks/README.md stays at most 300 lines (what each benchmark measures, how to run
    it, the latest table); results/ holds result files (JSON) only, no patches or scratch files."""
    bench = ROOT / "benchmarks"
    assert len((bench / "README.md").read_text(encoding="utf-8").splitlines()) <= 300
    others = [p.name for p in (bench / "results").iterdir() if p.suffix != ".json"]
    assert not others, f"benchmarks/results holds more than result files: {others}"
    assert not list(bench.rglob("*.patch")), "patches do not belong in benchmarks/"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, zk_server: ZooKeeperServer) -> Iterator[LocalCluster]:
    with make_cluster(tmp_path_factory, zk_server, "guide", replicas=2) as c:
        yield c


@pytest.fixture
def client(cluster: LocalCluster) -> Iterator[Client]:
    """A client per page: a client that dropped a table and made one of the same name again keeps
    the old definition for ``insert``, so no client sees two pages' tables of one name."""
    c = cluster.client(0)
    try:
        yield c
    finally:
        for table in c.tables():
            c.drop_table(table)
        c.close()


def run_block(block: Block, space: dict, workdir: Path) -> None:
    code = block.code.replace('"/tmp/mt"', repr(str(workdir / f"cluster-{block.index}")))
    try:
        exec(compile(code, block.where, "exec"), space)
    except ModuleNotFoundError as exc:
        if exc.name not in OPTIONAL:
            raise
        print(f"{block.where}: skipped, {exc.name} is not installed")


@pytest.mark.parametrize("page", runnable_pages())
def test_the_python_blocks_of_a_guide_page_run_as_written(
    page: Path, cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    """Each page's blocks, extracted from it (so the guide cannot drift from the product), run in
    order against a real ZooKeeper and replica processes; the page's own asserts check the
    results it states."""
    fixture = {"client": client, "cluster": cluster}
    space: dict = {"mergetxn": mergetxn, "pa": pa, "pc": pc, **fixture}
    for block in blocks(page):
        if block.marker:
            continue
        run_block(block, space, tmp_path)
        space.update(fixture)  # a block's own LocalCluster has ended: back to this module's


# -- the built site ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("guide") / "site"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env["NO_MKDOCS_2_WARNING"] = "1"
    mkdocs = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(out)]
    done = subprocess.run(mkdocs, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stderr[-4000:]}"
    return out


def test_the_guide_builds_with_strict(site: Path) -> None:
    """``mkdocs build --strict``: no broken link, no page missing from the nav, the generated
    reference complete (a marker left unreplaced would fail the hook)."""
    for page in ("index.html", "reference/python-api/index.html", "reference/cli/index.html"):
        assert (site / page).is_file(), page
    api = (site / "reference/python-api/index.html").read_text(encoding="utf-8")
    for name in ("mergetxn.connect", "mergetxn.LocalCluster", "mergetxn.Client", "mergetxn.Transaction"):
        assert f'id="{name}"' in api, name
    cli = (site / "reference/cli/index.html").read_text(encoding="utf-8")
    assert "mergetxn replica start" in cli and "--max-commit-bytes" in cli
    settings = (site / "reference/settings/index.html").read_text(encoding="utf-8")
    assert "retention_seconds" in settings and "MERGETXN_RETENTION_SECONDS" in settings
    errors = (site / "reference/errors/index.html").read_text(encoding="utf-8")
    assert "ConflictError" in errors and "KEY_WRITTEN" in errors and "130" in errors
    assert not (site / "gen_reference.py").exists()  # the hook is not published


def chromium() -> str | None:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    return found or ("/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None)


@pytest.fixture
def served(site: Path) -> Iterator[str]:
    handler = functools.partial(QuietHandler, directory=str(site))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base's name
        pass


def dump_dom(browser: str, url: str, profile: Path) -> str:
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--dump-dom",
    ]
    done = subprocess.run([browser, *flags, url], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"chromium failed on {url}:\n{done.stderr[-2000:]}"
    return done.stdout


@pytest.mark.slow
def test_the_built_site_renders_with_its_navigation_in_a_browser(served: str, tmp_path: Path) -> None:
    """Headless Chromium opens the home page and one reference page over HTTP: each renders its
    tabs and its navigation (the nav entries are in the DOM after the page's scripts ran)."""
    browser = chromium()
    if browser is None:
        pytest.skip("chromium is not installed (./dev test installs Debian's chromium when run as root)")
    tabs = ("Get started", "Concepts", "How-to", "Operations", "Reference", "Benchmarks", "Architecture")
    home = dump_dom(browser, served + "/", tmp_path / "profile")
    assert 'class="md-tabs' in home, home[:2000]
    for tab in tabs:
        assert re.search(rf'class="md-tabs__link[^"]*"[^>]*>\s*{re.escape(tab)}\s*<', home), tab
    assert "Transactions for replicated MergeTree-style tables" in home
    api = dump_dom(browser, served + "/reference/python-api/", tmp_path / "profile")
    assert 'id="mergetxn.Client"' in api
    for entry in ("Python API", "Command line", "Replica settings", "Errors and exit codes"):
        assert re.search(rf'class="md-nav__link[^"]*"[^>]*>\s*(<span[^>]*>\s*)?{re.escape(entry)}\s*<', api), entry
    assert 'data-md-component="search' in api  # the search box rendered
