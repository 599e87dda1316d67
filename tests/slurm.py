"""A real one-node Slurm cluster (Debian's ``slurm-wlm`` and ``munge``) that a test starts
and stops itself: a private ``munged`` (its own key and socket), ``slurmctld`` and ``slurmd``
as root on loopback, a partition of 2 CPUs, ``proctrack/linuxproc`` and ``task/none``.
Nothing is written outside the folder it is given; the client commands find the cluster
through ``SLURM_CONF`` in :attr:`SlurmCluster.env`."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

_BINARIES = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "scancel", "scontrol", "squeue")


def why_not() -> str | None:
    """One line saying why no cluster can start here, or None."""
    missing = [b for b in _BINARIES if shutil.which(b) is None]
    if missing:
        return f"Slurm cannot start: {', '.join(missing)} not installed (Debian slurm-wlm, munge: make system-deps)"
    if os.geteuid() != 0:
        return "Slurm cannot start: slurmd must run as root here (a one-node cluster of the test's own)"
    return None


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


class SlurmCluster:
    """slurmctld + slurmd + munged, in ``folder``; :meth:`start`, then :meth:`stop`."""

    def __init__(self, folder: Path, kill_wait: int = 2) -> None:
        self.dir = folder
        self.node = socket.gethostname().split(".")[0]
        ctl_port, d_port = _free_ports(2)
        for sub in ("state", "spool", "munge", "log"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(folder / "munge", 0o700)
        self.munge_socket = folder / "munge" / "munge.socket"
        self.conf = folder / "slurm.conf"
        self.conf.write_text(f"""\
ClusterName=sentinel-test
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={ctl_port}
SlurmdPort={d_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
CredType=cred/munge
StateSaveLocation={folder / 'state'}
SlurmdSpoolDir={folder / 'spool'}
SlurmctldPidFile={folder / 'slurmctld.pid'}
SlurmdPidFile={folder / 'slurmd.pid'}
SlurmctldLogFile={folder / 'log' / 'slurmctld.log'}
SlurmdLogFile={folder / 'log' / 'slurmd.log'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
KillWait={kill_wait}
MinJobAge=300
InactiveLimit=0
OverTimeLimit=0
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
NodeName={self.node} NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
""")
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, timeout: float = 60.0) -> None:
        """Start munged, slurmctld and slurmd; return when the node is idle.

        Raises:
            RuntimeError: a piece did not start; the message names it, with its log's tail.
        """
        key = self.dir / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        munge = self.dir / "munge"
        self._spawn(["munged", "-F", "--force", f"--key-file={key}", f"--socket={self.munge_socket}",
                     f"--pid-file={munge / 'munged.pid'}", f"--log-file={munge / 'munged.log'}",
                     f"--seed-file={munge / 'munged.seed'}"])
        self._until(lambda: self.munge_socket.exists(), timeout, "munged", munge / "munged.log")
        self._spawn(["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._spawn(["slurmd", "-D", "-f", str(self.conf), "-N", self.node])
        self._until(self._idle, timeout, "slurmctld/slurmd", self.dir / "log" / "slurmd.log")

    def _spawn(self, cmd: list[str]) -> None:
        self.procs.append(subprocess.Popen(cmd, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                           start_new_session=True))

    def _idle(self) -> bool:
        out = subprocess.run(["sinfo", "-h", "-o", "%t", "-n", self.node], env=self.env, capture_output=True,
                             text=True, timeout=10)
        return out.returncode == 0 and out.stdout.strip() in ("idle", "mix", "alloc")

    def _until(self, cond: object, timeout: float, what: str, logfile: Path) -> None:
        deadline = time.monotonic() + timeout
        while not cond():  # type: ignore[operator]
            dead = [p.args for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                tail = logfile.read_text(errors="replace")[-1500:] if logfile.exists() else "(no log)"
                self.stop()
                raise RuntimeError(f"{what} did not start{' (exited: ' + str(dead) + ')' if dead else ''}: {tail}")
            time.sleep(0.1)

    def command(self, *args: str, **kw: object) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this cluster."""
        return subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=60,
                              **kw)  # type: ignore[call-overload,no-any-return]

    def job_state(self, job_id: str) -> str:
        out = self.command("scontrol", "show", "job", "-o", job_id).stdout
        for field in out.split():
            if field.startswith("JobState="):
                return field.split("=", 1)[1]
        return ""

    def stop(self) -> None:
        """Stop every daemon this cluster started, newest first (by PID)."""
        from tests.helpers import end_process

        for proc in reversed(self.procs):
            end_process(proc)
        self.procs.clear()
