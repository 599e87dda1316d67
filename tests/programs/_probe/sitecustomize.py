"""The zoo harness's snapshot of Sentinel's view, taken as the program's Python exits.

``sentinel run`` stops its daemon when the program exits, so the harness cannot read
``/metrics`` afterwards. This file sits on the program's ``PYTHONPATH`` (in the plain runs
too, so both runs see the same path); Sentinel's shim chains to it. Only when
``ZOO_SNAPSHOT`` and ``SENTINEL_URL`` are set, in the program's own process (not a forked or
spawned worker; rank 0 under torchrun, the first process under Fabric's launcher), it
registers an ``atexit`` function. That runs after Sentinel's own exit handler (``atexit`` is
last in, first out, and Sentinel's is registered later, at ``import torch``), waits until
``/metrics`` shows the step counts the program wrote to its reference file (``ZOO_REF``), or
10 s, and writes ``/metrics`` and ``/api/v1/alerts`` to ``ZOO_SNAPSHOT``. Standard library
only; it never imports sentinel.
"""

import atexit
import json
import os
import re
import sys
import time
import urllib.request

_PID = os.getpid()


def _get(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


def _wanted():
    try:
        with open(os.environ["ZOO_REF"]) as f:
            ref = json.load(f)
    except (KeyError, OSError, ValueError):
        return None
    return ref.get("optimizer_steps")


def _shows(text, wanted):
    run = os.environ.get("SENTINEL_RUN", "")
    steps = [float(v) for labels, v in re.findall(r"^sentinel_step\{([^}]*)\} (\S+)$", text, re.M)
             if f'run="{run}"' in labels]
    if wanted is None:
        return bool(steps)
    want = sorted(float(n) for n in wanted if n)
    return sorted(steps)[-len(want):] == want if want else True


def _snapshot():
    if os.getpid() != _PID:
        return
    url, out = os.environ["SENTINEL_URL"], os.environ["ZOO_SNAPSHOT"]
    wanted = _wanted()
    deadline = time.monotonic() + 10.0
    text, alerts, error = "", [], None
    while True:
        try:
            text = _get(url + "/metrics")
            alerts = json.loads(_get(url + "/api/v1/alerts"))["data"]["alerts"]
            error = None
        except Exception as exc:  # the daemon is gone: keep what was read
            error = repr(exc)
        if (error is None and _shows(text, wanted)) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    with open(out, "w") as f:
        json.dump({"metrics": text, "alerts": alerts, "error": error}, f)


def _is_the_program() -> bool:
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    # rank 0 of torchrun's; the first process of a launcher that starts the others by running
    # the command line again with only LOCAL_RANK set (Lightning Fabric's, Lightning's)
    return (script == os.environ.get("ZOO_PROGRAM") and os.environ.get("RANK", "0") == "0"
            and os.environ.get("LOCAL_RANK", "0") == "0")


if os.environ.get("ZOO_SNAPSHOT") and os.environ.get("SENTINEL_URL") and _is_the_program():
    atexit.register(_snapshot)
