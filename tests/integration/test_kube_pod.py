"""The pod of deploy/kubernetes/training-job.yaml, as far as it runs without a cluster: the
sidecar's and the trainer's commands and environment from the manifest, run here as two
processes with the pod's paths moved under a temporary folder (no kubelet, no images can run
on these machines). The trainer's ``sentinel run`` attaches to the sidecar through
``SENTINEL_SOCKET``, starts no daemon of its own, and its steps reach the sidecar's /metrics;
the probes' /healthz answers."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.helpers import end_process, wait_for, write_config

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).parent / "scripts"


def test_the_trainer_reports_to_its_sidecar_through_the_shared_socket(tmp_path: Path) -> None:
    job = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "training-job.yaml").read_text())
    pod = job["spec"]["template"]["spec"]
    [sidecar], [trainer] = pod["initContainers"], pod["containers"]

    def moved(value: str) -> str:  # the pod's mounts, under tmp_path
        return value.replace("/run/sentinel", str(tmp_path / "run")).replace("/etc/sentinel", str(tmp_path / "etc"))

    (tmp_path / "etc").mkdir()
    write_config(tmp_path / "etc", history={"path": str(tmp_path / "h.sqlite")})
    args = [moved(a) for a in sidecar["args"]]
    assert args[:2] == ["sentinel", "daemon"]
    args[args.index("--listen") + 1] = "127.0.0.1:0"  # the pod's 0.0.0.0:9400, on loopback here
    daemon = subprocess.Popen([sys.executable, "-m", "sentinel.cli", *args[1:]], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    try:
        m = re.search(r"SENTINEL_SOCKET=(\S+) SENTINEL_URL=(\S+)", daemon.stdout.readline())  # type: ignore[union-attr]
        assert m, "the sidecar printed no address"
        url = m.group(2)
        with urllib.request.urlopen(url + sidecar["readinessProbe"]["httpGet"]["path"], timeout=5) as r:
            assert r.status == 200
        env = {e["name"]: moved(e["value"]) for e in trainer["env"] if "value" in e}
        env.update(SENTINEL_URL=url, SENTINEL_RUN="pod-train-0")  # the fieldRef (the pod's name)
        release = tmp_path / "release"
        release.touch()
        assert trainer["args"][:3] == ["sentinel", "run", "--"]
        out = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--", sys.executable,
                              str(SCRIPTS / "plain_train.py"), "25", str(release)],
                             env={**os.environ, **env}, capture_output=True, text=True, timeout=180)
        assert out.returncode == 0 and "metrics at" not in out.stderr, out.stderr

        def stepped() -> bool:
            with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
                return 'sentinel_step{job="train",rank="0",run="pod-train-0"} 25.0' in r.read().decode()

        wait_for(stepped, timeout=30, what="the trainer's steps on the sidecar's /metrics")
    finally:
        end_process(daemon)  # type: ignore[arg-type]
