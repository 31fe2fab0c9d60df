"""A CPU-weighted stack sampler that ``history_cost.py --profile`` loads into the replica process
(this folder is put on the replica's PYTHONPATH only then; py-spy is not installed here).

Every ``INTERVAL`` seconds it looks at each thread's CPU clock; a thread whose clock advanced since
the last look has its stack counted, weighted by the CPU it used. ``$MERGETXN_SAMPLER_DIR/control``
names the sample being taken (empty: none): a new name starts a fresh count, an empty file after a
name writes ``<name>.json`` there (self and inclusive CPU seconds per function, per thread name).
"""

from __future__ import annotations

import collections
import json
import os
import sys
import threading
import time

INTERVAL = 0.004


def _where(code) -> str:
    return f"{os.path.basename(code.co_filename)}:{code.co_firstlineno}:{code.co_name}"


def _run(folder: str) -> None:
    control = os.path.join(folder, "control")
    label = ""
    clocks: dict[int, float] = {}
    selfs: collections.Counter = collections.Counter()
    incl: collections.Counter = collections.Counter()
    by_thread: collections.Counter = collections.Counter()
    total = 0.0
    last_check = 0.0
    me = threading.get_ident()
    while True:
        now = time.monotonic()
        if now - last_check > 0.2:
            last_check = now
            try:
                with open(control) as f:
                    want = f.read().strip()
            except OSError:
                want = ""
            if want != label:
                if label and not want:
                    out = {
                        "cpu_seconds": round(total, 4),
                        "by_thread": {k: round(v, 4) for k, v in by_thread.most_common()},
                        "self": {k: round(v, 4) for k, v in selfs.most_common(60)},
                        "inclusive": {k: round(v, 4) for k, v in incl.most_common(80)},
                    }
                    tmp = os.path.join(folder, f".{label}.json")
                    with open(tmp, "w") as f:
                        json.dump(out, f, indent=1)
                    os.replace(tmp, os.path.join(folder, f"{label}.json"))
                label = want
                selfs.clear(), incl.clear(), by_thread.clear(), clocks.clear()
                total = 0.0
        if not label:
            time.sleep(0.2)
            continue
        names = {t.ident: t.name for t in threading.enumerate()}
        for ident, frame in sys._current_frames().items():
            if ident == me:
                continue
            try:
                clock = time.clock_gettime(time.pthread_getcpuclockid(ident))
            except Exception:  # noqa: BLE001 - the thread ended meanwhile
                continue
            used = clock - clocks.get(ident, clock)
            clocks[ident] = clock
            if used <= 0:
                continue
            total += used
            name = names.get(ident, "?").rstrip("0123456789-_ ") or "?"
            by_thread[name] += used
            selfs[_where(frame.f_code)] += used
            seen = set()
            while frame is not None:
                w = _where(frame.f_code)
                if w not in seen:
                    seen.add(w)
                    incl[w] += used
                frame = frame.f_back
        time.sleep(INTERVAL)


def _guarded(folder: str) -> None:
    try:
        _run(folder)
    except BaseException as exc:  # noqa: BLE001 - say why the profile is missing
        with open(os.path.join(folder, "sampler-error.txt"), "w") as f:
            f.write(repr(exc))


if os.environ.get("MERGETXN_SAMPLER_DIR") and "replicas.server" in getattr(sys, "orig_argv", []):
    threading.Thread(target=_guarded, args=(os.environ["MERGETXN_SAMPLER_DIR"],), name="sampler", daemon=True).start()
