"""LocalCluster's replicas run the code of the checkout that started them.

Each replica is ``python -m replicas.server`` with the project's root first on PYTHONPATH: when
that root was wrong (``mergetxn/`` after the module moved to ``mergetxn/local/``), the replicas
imported whatever ``replicas`` the working directory or the installed package held, and a
benchmark of another checkout's code measured this one's replicas.
"""

from __future__ import annotations

from pathlib import Path

import coordinator
import replicas
from mergetxn.local.cluster import PROJECT_ROOT


def test_the_replicas_path_holds_the_packages_this_process_imported() -> None:
    assert (PROJECT_ROOT / "replicas" / "server.py").is_file()
    assert Path(replicas.__file__).resolve().parents[1] == PROJECT_ROOT
    assert Path(coordinator.__file__).resolve().parents[1] == PROJECT_ROOT
