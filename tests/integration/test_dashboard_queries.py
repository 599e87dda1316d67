"""Every query of every dashboard, its variables substituted, against a real Prometheus
(Debian's package, on loopback) that scraped real runs: a ``sentinel demo --fault nan`` and
a two-rank ``sentinel run -- torchrun`` DDP job (gloo) that clips, scales its loss with a
GradScaler and has a straggler. No Grafana server can run on these machines, so Grafana's
part (substituting ``$job``, ``$__rate_interval``, …) is done here as Grafana does it.

One demo, one torchrun job and one Prometheus serve the whole module.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import end_process, start_prometheus, wait_for
from tests.integration.test_run import LOG, SCRIPTS, _start

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed")]

ROOT = Path(__file__).resolve().parents[2]
DDP_STEPS = 80

NEEDS_GPU = {  # no data without a CUDA device or an NVML driver (tests/gpu covers the probes)
    "CUDA memory", "CUDA allocator retries and OOMs", "GPU utilisation", "GPU temperature", "GPU power",
    "GPU memory", "Clock throttle reasons", "ECC errors", "XID errors",
    "dcgm-exporter SM clock of the same GPUs",  # and a dcgm-exporter scraped beside
}
NEEDS_RANKS = {  # filled only by a several-rank job: covered by the torchrun job, never skipped
    "Straggler: busy time / other ranks'", "Divergence: grad norm off the median",
    "Busy time per rank (data + forward)",
}
NEEDS_AMP_OR_CLIP = {  # filled only where the script clips or scales (or evaluates): covered by the torchrun job
    "AMP loss scale", "Skipped steps (AMP overflow)", "Clipping",
    "Seconds since the last step, and the run's last heartbeat",  # its heartbeat: rank 0's evaluation
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _api(base: str, path: str, **params: str) -> dict[str, Any]:
    url = f"{base}{path}?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return dict(json.load(r))
    except urllib.error.HTTPError as exc:  # 400: the query does not parse
        return dict(json.load(exc))
    except OSError as exc:
        return {"status": "error", "error": str(exc)}


class Scraped:
    def __init__(self, base: str, start: float, ddp_run: str) -> None:
        self.base, self.start, self.ddp_run = base, start, ddp_run

    def range(self, expr: str) -> dict[str, Any]:
        return _api(self.base, "/api/v1/query_range", query=expr, start=f"{self.start:.3f}",
                    end=f"{time.time():.3f}", step="1")


# both export profiles (serve/profile.py): the dashboards and rules must work in each; the
# fleet one is switched on by the config file for the torchrun job, by the environment for the demo
@pytest.fixture(scope="module", params=[pytest.param("full", marks=pytest.mark.slow),  # a real Prometheus over real runs:
                                        pytest.param("fleet", marks=pytest.mark.slow)])  # make test-slow
def scraped(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Scraped]:
    import os

    tmp = tmp_path_factory.mktemp("promdash")
    release = tmp / "release"
    start = time.time()
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    config = None
    if request.param == "fleet":
        config = str(tmp / "fleet.yaml")
        Path(config).write_text("profile: fleet\n")
    ddp, ddp_url = _start([torchrun, "--standalone", "--nproc-per-node", "2",
                           str(SCRIPTS / "ddp_amp_train.py"), str(DDP_STEPS), str(release)], config)
    demo_port = _free_port()
    demo = subprocess.Popen([sys.executable, "-m", "sentinel.cli", "demo", "--fault", "nan", "--steps", "200",
                             "--fault-step", "120", "--delay", "0.03", "--listen", f"127.0.0.1:{demo_port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "SENTINEL_PROFILE": request.param})
    prom_port = _free_port()
    targets = [ddp_url.removeprefix("http://"), f"127.0.0.1:{demo_port}"]
    # honor_labels: job, run and rank are the training job's, as the dashboards expect
    rule_files = json.dumps([str(ROOT / "alerts" / f) for f in ("sentinel.rules.yml", "sentinel.job.rules.yml")])
    prom = start_prometheus(tmp, "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                            f"rule_files: {rule_files}\n"
                            "scrape_configs: [{job_name: sentinel, honor_labels: true, "
                            f"static_configs: [{{targets: {json.dumps(targets)}}}]}}]\n", prom_port)
    base = f"http://127.0.0.1:{prom_port}"

    def result(expr: str) -> list[Any]:
        body = _api(base, "/api/v1/query", query=expr)
        return list(body.get("data", {}).get("result", [])) if body.get("status") == "success" else []

    try:
        assert ddp.stdout is not None
        trained = ""  # both ranks print "rank N trained"; their writes may share a line
        while trained.count("trained") < 2:
            line = ddp.stdout.readline()
            if not line:
                break
            trained += line
        assert trained.count("trained") == 2, trained
        with urllib.request.urlopen(ddp_url + "/metrics", timeout=10) as r:
            last = re.findall(r'^sentinel_step\{[^}]*job="train"[^}]*\} (\S+)$', r.read().decode(), re.M)
        assert len(last) == 2, last
        wait_for(lambda: len(result(f'sentinel_step{{job="train"}} >= {min(float(v) for v in last)}')) == 2,
                 timeout=60, what="Prometheus to hold the last step of both torchrun ranks")
        wait_for(lambda: result('sentinel_rank_step_time_ratio{job="train"}'), timeout=60,
                 what="the straggler comparison")
        wait_for(lambda: demo.poll() is not None, timeout=400, what="the demo to finish")
        wait_for(lambda: result('max_over_time(sentinel_step{job="demo"}[10m]) >= 150'), timeout=30,
                 what="Prometheus to hold the demo's late steps")
        [run] = {m["metric"]["run"] for m in result('sentinel_step{job="train"}')}
        yield Scraped(base, start, run)
    except BaseException:
        print("sentinel run stderr:\n" + "".join(LOG))
        raise
    finally:
        release.touch()
        end_process(demo)
        prom.terminate()
        prom.wait(20)
        try:
            ddp.wait(60)
        finally:
            end_process(ddp)


def _substitute(expr: str, job: str, run: str, rank: str = ".*") -> str:
    """What Grafana sends for one choice of the variables ("All" is ``.*``, the allValue)."""
    for var, value in (("$job", job), ("$run", run), ("$rank", rank), ("$group", ".*"),
                       ("$__rate_interval", "10s")):
        expr = expr.replace(var, value)
    assert "$" not in expr, expr
    return expr


def _dashboards() -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted((ROOT / "dashboards").glob("*.json"))}


def test_every_panel_query_parses_and_returns_data(scraped: Scraped) -> None:
    from sentinel.dashboards import panel_queries

    empty: list[str] = []
    by_ddp: set[str] = set()
    checked = 0
    for stem, doc in _dashboards().items():
        for title, expr in panel_queries(doc):
            got = False
            for job, run in (("demo", "demo-nan"), ("train", scraped.ddp_run)):
                body = scraped.range(_substitute(expr, job, run))
                assert body.get("status") == "success", f"{stem}/{title}: {expr}: {body.get('error')}"
                if body["data"]["result"]:
                    got = True
                    if job == "train":
                        by_ddp.add(title)
            checked += 1
            if not got and title not in NEEDS_GPU:
                empty.append(f"{stem}/{title}: {expr}")
    assert checked >= 40
    assert empty == [], "panels without data:\n" + "\n".join(empty)
    assert NEEDS_RANKS | NEEDS_AMP_OR_CLIP <= by_ddp


def test_each_rank_is_selected_by_the_rank_variable(scraped: Scraped) -> None:
    for rank in ("0", "1"):
        body = scraped.range(_substitute('sentinel_step_busy_seconds{job=~"$job", run=~"$run", rank=~"$rank"}',
                                         "train", scraped.ddp_run, rank))
        assert {m["metric"]["rank"] for m in body["data"]["result"]} == {rank}


def test_the_variables_list_the_runs_ranks_and_groups(scraped: Scraped) -> None:
    doc = _dashboards()["overview"]
    values: dict[str, set[str]] = {}
    for var in doc["templating"]["list"]:
        if var["type"] != "query":
            continue
        m = re.fullmatch(r"label_values\((.+), (\w+)\)", var["query"]["query"])
        assert m, var["query"]
        match = _substitute(m.group(1), ".*", ".*")
        body = _api(scraped.base, f"/api/v1/label/{m.group(2)}/values", **{"match[]": match})
        values[var["name"]] = set(body["data"])
    assert {"demo", "train"} <= values["job"]
    assert {"demo-nan", scraped.ddp_run} <= values["run"]
    assert {"0", "1"} <= values["rank"]
    assert {"layers.1", "head"} <= values["group"]


def test_the_alert_annotation_marks_the_nan(scraped: Scraped) -> None:
    from sentinel.dashboards import panel_queries

    [(_, expr)] = [q for q in panel_queries(_dashboards()["overview"]) if q[0].startswith("annotation")]
    body = scraped.range(_substitute(expr, "demo", "demo-nan"))
    assert {m["metric"]["alertname"] for m in body["data"]["result"]} >= {"TrainingNonFinite"}


def test_the_job_wide_recording_rules_hold_both_jobs(scraped: Scraped) -> None:
    """alerts/sentinel.job.rules.yml over what the daemons export, in either profile."""
    import yaml

    doc = yaml.safe_load((ROOT / "alerts" / "sentinel.job.rules.yml").read_text())
    records = [r["record"] for g in doc["groups"] for r in g["rules"] if "record" in r]
    assert len(records) >= 8
    for name in records:
        body = wait_for(lambda: (b := scraped.range(name)) and b["data"]["result"] and b, timeout=30, what=name)
        runs = {m["metric"]["run"] for m in body["data"]["result"]}
        assert {"demo-nan", scraped.ddp_run} <= runs, (name, runs)
    [ddp] = scraped.range(f'job_run:sentinel_ranks:count{{run="{scraped.ddp_run}"}}')["data"]["result"]
    assert ddp["values"][-1][1] == "2"
    # the replicated DDP norm: any rank's, in both profiles
    norms = scraped.range(f'job_run:sentinel_grad_norm:l2{{run="{scraped.ddp_run}"}} '
                          f'- on (job, run) max by (job, run) (sentinel_grad_norm{{run="{scraped.ddp_run}"}})')
    # (while training, a rule evaluation and the raw series may be a step apart; once it holds still, equal)
    assert norms["data"]["result"] and float(norms["data"]["result"][0]["values"][-1][1]) == 0.0
