"""The engine process that ``sentinel.watch`` starts by default (``engine="process"``).

Running the engine in a process of its own keeps its Python work (decode, rules, HTTP)
off the training process's GIL. It receives frames on a private Unix datagram socket,
sends ``ready``, ``alert`` and ``stop`` messages back to the training process's reply
socket, and exits when its standard input closes, i.e. when the training process ends.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import time
from collections.abc import Sequence
from typing import Any

from sentinel import wire
from sentinel.config import load_config
from sentinel.daemon.listener import DatagramListener
from sentinel.daemon.service import Service
from sentinel.lines import ScriptLines

log = logging.getLogger("sentinel")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sentinel.daemon.child")
    p.add_argument("--socket", required=True)
    p.add_argument("--reply", required=True)
    p.add_argument("--listen", required=True)
    p.add_argument("--config", default=None)
    p.add_argument("--restarts", type=int, default=0, help="times the training process restarted its engine")
    args = p.parse_args(argv)
    # the training job comes first when they share cores: a lower priority, and a batch
    # policy so that a frame's arrival does not preempt the sender mid-hook
    try:
        os.nice(10)
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except (OSError, AttributeError):
        pass
    handler = logging.StreamHandler()  # the training script's stderr: `sentinel: ...` lines
    handler.setFormatter(ScriptLines())
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    reply = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    reply.setblocking(False)

    def tell(msg: wire.Message | dict[str, Any]) -> None:
        try:
            reply.sendto(wire.encode_message(msg), args.reply)
        except OSError:
            pass  # the training process is gone or busy: its loss, never ours
        except wire.FrameError:  # a bug on this side: the message is lost, the engine goes on
            log.warning("sentinel engine: a reply off the schema was not sent", exc_info=True)

    cfg, pack = load_config(args.config)
    service = Service(cfg, pack, args.listen, on_message=tell)
    listener = DatagramListener(args.socket, service.submit_many)
    service.extra_rows.append(listener.rows)
    restarts = float(args.restarts)
    service.extra_rows.append(lambda: iter([("sentinel_engine_restarts_total", "counter", (), restarts)]))
    parent = os.getppid()
    tell(wire.Ready(url=service.url))
    try:
        sys.stdin.buffer.read()  # returns at EOF: the training process closed us or died
    except KeyboardInterrupt:
        pass  # Ctrl-C reaches the whole process group; finish the same way
    else:
        _left_without_goodbye(service, parent)
    listener.close()
    service.stop()
    return 0


def _left_without_goodbye(service: Service, parent: int, wait: float = 2.0) -> None:
    """The training process closed this engine's pipe: when it died doing so, with runs
    it had not said goodbye to (killed: SIGKILL, the OOM killer; a crash in native code),
    record their end, exit status unknown, so ``TrainingCrashed`` says so and the history
    does not keep them running for good. It is dead once this process is no longer its
    child (the kernel gives an orphan to another parent as its parent exits, just after
    closing its files); one that closed the pipe and lives on is left alone."""
    service.flush()  # the frames it sent before: a goodbye among them
    engine = service.engine
    open_runs = [key for key in list(engine.runs_seen) if engine.rules.ranks(*key)]
    if not open_runs:
        return
    deadline = time.monotonic() + wait
    while os.getppid() == parent:
        if time.monotonic() > deadline:
            return
        time.sleep(0.01)
    for job, run in open_runs:
        engine.exited(job, run, -1, who=f"pid {parent} ended without a goodbye: killed (the OOM killer's SIGKILL: "
                                        "check dmesg) or a crash in native code")


if __name__ == "__main__":
    sys.exit(main())
