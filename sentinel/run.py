"""``sentinel run -- CMD``: a daemon for the job, CMD instrumented without code changes."""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import sentinel_hooks

from sentinel.config import SentinelConfig
from sentinel.daemon.daemon import Daemon
from sentinel.instrument.options import MAX_TAGS, default_run_name, env_tags, launcher_run_name, slurm_tags
from sentinel.rules.config import RulePack
from sentinel.signals import forwarding

if TYPE_CHECKING:
    from sentinel.engine.engine import Engine
    from sentinel.nodeshare import NodeShare

log = logging.getLogger("sentinel")


_TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")
_TORCHRUN_FLAGS = frozenset(("--standalone", "--no-python", "--no_python", "--run-path", "--run_path", "--module",
                             "-m", "--use-env", "--use_env"))
"""torchrun's options that take no value."""


def torchrun_options(cmd: Sequence[str]) -> dict[str, str]:
    """The options of a ``torchrun`` (or ``python -m torch.distributed.run``) command, before
    its script, as ``{"rdzv_id": "X", "nnodes": "2", ...}``; {} for any other command."""
    at = None
    if cmd and os.path.basename(cmd[0]) == "torchrun":
        at = 1
    for i in range(len(cmd) - 1):
        if cmd[i] == "-m" and cmd[i + 1] in _TORCHRUN_MODULES and os.path.basename(cmd[0]).startswith("python"):
            at = i + 2
            break
    if at is None:
        return {}
    out: dict[str, str] = {}
    args = list(cmd[at:])
    while args and args[0].startswith("-"):
        opt = args.pop(0)
        if "=" in opt:
            opt, value = opt.split("=", 1)
        elif opt in _TORCHRUN_FLAGS or not args:
            value = ""
        else:
            value = args.pop(0)
        out[opt.lstrip("-").replace("-", "_")] = value
    return out


def run_name(cmd: Sequence[str], env: Mapping[str, str]) -> tuple[str, str]:
    """The run name every rank of ``cmd`` reports under, and a line for stderr when the
    nodes of a multi-node job will not agree on it ('' when they do).

    A launcher's id (``SENTINEL_RUN``, Slurm's job) comes first; then torchrun's
    ``--rdzv-id``, which every node of the job is given; else the host and the time, which
    only the ranks of this node share."""
    name = launcher_run_name(env)
    if name:
        return name, ""
    opts = torchrun_options(cmd)
    if opts.get("rdzv_id", "none") != "none":
        return opts["rdzv_id"], ""
    nodes = opts.get("nnodes", "1").split(":")[-1]
    note = ""
    if "standalone" not in opts and nodes.isdigit() and int(nodes) > 1:
        note = (f"sentinel: torchrun --nnodes {opts['nnodes']} with no --rdzv-id: each node names its run itself "
                "(host and time), so the nodes' ranks report as separate runs; give every node the same "
                "SENTINEL_RUN or --rdzv-id")
    return default_run_name(env), note


def child_env(socket_path: str, url: str, base: dict[str, str] | None = None,
              tags: dict[str, str] | None = None, cmd: Sequence[str] = ()) -> dict[str, str]:
    """The environment that switches instrumentation on in every Python that CMD starts
    (``tags``: ``--tag``s, for the zero-code monitors through ``SENTINEL_TAGS``; ``cmd``:
    the command, whose torchrun ``--rdzv-id`` names the run, see :func:`run_name`)."""
    env = dict(os.environ if base is None else base)
    if tags or slurm_tags(env):
        merged = {**env_tags(env.get("SENTINEL_TAGS")), **(tags or {})}
        for k, v in slurm_tags(env).items():  # under Slurm: job id, step id and node name, within the cap
            if k not in merged and len(merged) < MAX_TAGS:
                merged[k] = v
        env["SENTINEL_TAGS"] = json.dumps(merged)
    hooks_dir = os.path.dirname(os.path.abspath(sentinel_hooks.__file__))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (hooks_dir, env.get("PYTHONPATH", "")) if p)
    env.update(SENTINEL_AUTO="1", SENTINEL_SOCKET=socket_path, SENTINEL_URL=url)
    env["SENTINEL_RUN"] = run_name(cmd, env)[0]  # one name for every rank of the job
    return env


def run_command(cmd: list[str], config: SentinelConfig, pack: RulePack, listen: str,
                tags: dict[str, str] | None = None) -> int:
    """Start a daemon, run ``cmd`` under it, hand the signals that stop or checkpoint a job on
    to it (:mod:`sentinel.signals`), return its exit status (128 + N when it died by signal
    N, as a shell reports it).

    A non-zero status is recorded as a crash of every rank that had not finished
    (``TrainingCrashed``), delivered before the daemon stops.

    With ``SENTINEL_SOCKET`` naming a live daemon's socket (``sentinel daemon`` started by
    a Slurm batch script, a prolog, a sidecar or systemd), no daemon is started: CMD reports
    to that one, and a non-zero exit is sent to it (see :mod:`sentinel.attach`)."""
    from sentinel.attach import attached_socket, run_attached

    socket_path = attached_socket(os.environ)
    if socket_path is not None:
        return run_attached(cmd, socket_path, tags or {})
    from sentinel.nodeshare import claim

    share = claim(os.environ)  # the tasks of a Slurm step on this node: one starts the daemon
    if share is not None and not share.starter:
        status = 1
        try:
            status = run_attached(cmd, share.socket_path, tags or {}, url=share.url)
        finally:
            share.leave(status)
        return status
    if share is not None:
        try:
            return _run(cmd, config, pack, listen, share.socket_path, tags or {}, share)
        finally:
            share.close()
    folder = tempfile.mkdtemp(prefix="sentinel-run-")  # 0700, a fresh name: nothing to plant
    try:
        return _run(cmd, config, pack, listen, os.path.join(folder, "engine.sock"), tags or {})
    finally:  # every exit path: sockets a crashed rank left, and the folder itself
        shutil.rmtree(folder, ignore_errors=True)


_WHY = {"-I": "runs isolated (it ignores PYTHONPATH)", "-E": "ignores the PYTHON* variables (PYTHONPATH among them)",
        "-S": "imports no site module (nor the sitecustomize Sentinel loads through)"}


def unloadable(cmd: Sequence[str]) -> str | None:
    """The option of a ``python`` command that keeps Sentinel out of it, or None: ``-I``
    and ``-E`` ignore ``PYTHONPATH``, through which the launcher's shim loads; ``-S`` imports
    no ``site``, which runs the shim."""
    if not cmd or not re.fullmatch(r"python[\d.]*", os.path.basename(cmd[0])):
        return None
    args = iter(cmd[1:])
    for arg in args:
        if arg == "-" or not arg.startswith("-") or arg.startswith("--"):
            return None  # the script (or stdin), or a long option
        for i, flag in enumerate(arg[1:], 1):
            if flag in "IES":
                return f"-{flag}"
            if flag in "cm":
                return None  # what follows is the program's
            if flag in "WX":  # its value: the rest of this argument, or the next one
                if i == len(arg) - 1:
                    next(args, None)
                break
    return None


def _run(cmd: list[str], config: SentinelConfig, pack: RulePack, listen: str, socket_path: str,
         tags: dict[str, str], share: NodeShare | None = None) -> int:
    daemon = Daemon(config, pack, listen, socket_path)
    try:
        if share is not None:
            share.publish(daemon.url)
        return _supervise(cmd, daemon, tags, share)
    finally:
        daemon.stop()


def _supervise(cmd: list[str], daemon: Daemon, tags: dict[str, str], share: NodeShare | None = None) -> int:
    """Run ``cmd`` under ``daemon``; with ``share``, the daemon also serves the node's
    other tasks of the Slurm step, and lives until the last of them ended: the run's
    recorded exit status is then the highest of the node's tasks' (what ``srun`` reports)."""
    print(f"sentinel: metrics at {daemon.url}/metrics", file=sys.stderr)
    env = child_env(daemon.socket_path, daemon.url, tags=tags, cmd=cmd)
    note = run_name(cmd, os.environ)[1]
    if note:
        print(note, file=sys.stderr)
    flag = unloadable(cmd)
    if flag is not None:
        print(f"sentinel: {os.path.basename(cmd[0])} {flag} {_WHY[flag]}, so Sentinel cannot load into it and "
              f"nothing it trains is watched: drop {flag}", file=sys.stderr)
    guard = daemon.service.config.actions.guard.to_options()  # actions.guard: the zero-code monitors'
    if guard is not None and "SENTINEL_GUARD" not in os.environ:
        env["SENTINEL_GUARD"] = json.dumps(guard)
    history = daemon.service.history
    job = env.get("SENTINEL_JOB") or "train"
    if history is not None:
        history.run_started(job, env["SENTINEL_RUN"], shlex.join(cmd), env_tags(env.get("SENTINEL_TAGS")))
    try:
        proc = subprocess.Popen(cmd, env=env)
    except OSError as exc:
        print(f"sentinel: cannot run {cmd[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127
    engine = daemon.service.engine
    engine.owned_pids.add(proc.pid)  # its exit status comes from wait(), not from a liveness guess

    others: list[int] = []
    # caught until the end is recorded and delivered, not only while CMD runs: Slurm sends
    # its time limit's SIGTERM twice, milliseconds apart, and a second one that found the
    # default action back would end this process before TrainingCrashed said why
    with forwarding(proc, os.environ):
        rc = proc.wait()
        if share is not None:  # still caught: a signal for the step must not end this daemon
            others = share.wait_for_others()
        status = 128 - rc if rc < 0 else rc
        _record_end(cmd, proc.pid, status, others, daemon, env, share)
        daemon.stop()  # the drain: TrainingCrashed goes out before the handlers do
    return status


def _reported_as(engine: Engine, job: str, run: str) -> list[str]:
    """The runs CMD's frames went to: ``run``, the name it was started under, unless it sent
    none under it and some under names of its own (a script's ``sentinel.watch(run="exp-42")``),
    whose rows and alerts then get its command, its exit status and its crash."""
    seen = [r for j, r in engine.runs_seen if j == job]
    return [run] if run in seen or not seen else sorted(seen)


def _record_end(cmd: list[str], pid: int, status: int, others: list[int], daemon: Daemon, env: dict[str, str],
                share: NodeShare | None) -> None:
    """CMD ended with ``status`` (the node's other tasks with ``others``): its run's end in
    the history, a word when it sent nothing, and ``TrainingCrashed`` for a non-zero status,
    with what Slurm says of it."""
    engine, history = daemon.service.engine, daemon.service.history
    job = env.get("SENTINEL_JOB") or "train"
    daemon.listener.close()  # every frame CMD sent is in, and ingested, before judging the exit
    daemon.service.flush()
    runs = _reported_as(engine, job, env["SENTINEL_RUN"]) if share is None else [env["SENTINEL_RUN"]]
    if history is not None:
        if runs != [env["SENTINEL_RUN"]]:
            history.run_moved(job, env["SENTINEL_RUN"], runs)
        for run in runs:
            history.run_ended(job, run, max([status, *others]))
    if not status and share is None and engine.frames_received == 0 and unloadable(cmd) is None:
        # what it cannot watch: a run that would otherwise end without a word
        print(f"sentinel: {os.path.basename(cmd[0])} sent no report: it stepped no torch optimizer and changed no "
              "parameter between backward() calls (an evaluation, or gradients of the inputs alone: nothing is "
              "trained; gradients taken with torch.func.grad are not seen), or it ended before its first report "
              "went out", file=sys.stderr)
    if status:
        from sentinel.slurm import end_reason

        reason = end_reason(status, env)
        who = f"{os.path.basename(cmd[0])} (pid {pid})" + (f" ({reason})" if reason else "")
        for run in runs:
            engine.exited(job, run, status, who=who)  # TrainingCrashed: its line on stderr
