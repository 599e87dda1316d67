"""deploy/kubernetes/ against the Kubernetes schemas (kubernetes-validate, strict: no unknown
field) and prometheus-operator's (cloudcoil's generated models of its CRDs, and a round trip
that drops nothing), the generated manifests equal to what the code generates now, the
PrometheusRule equal to the exported rule files, and the conventions the docs promise. No
cluster can run here: these checks are what can be checked without one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from sentinel.kube import generated
from sentinel.rules.promjob import export_job_rules

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
K8S_VERSION = "1.33"


def _docs() -> dict[str, dict[str, Any]]:
    return {p.name: yaml.safe_load(p.read_text()) for p in sorted(KUBE.glob("*.yaml")) if p.name != "kustomization.yaml"}


def _check(doc: dict[str, Any]) -> None:
    """Raise unless ``doc`` is valid against its kind's schema."""
    if doc["apiVersion"].startswith("monitoring.coreos.com/"):
        from cloudcoil.models.prometheus_operator import v1, v1alpha1

        module = v1 if doc["apiVersion"].endswith("/v1") else v1alpha1
        model = getattr(module, doc["kind"]).model_validate(doc)
        back = model.model_dump(by_alias=True, exclude_none=True, mode="json")
        if back != doc:
            raise ValueError(f"{doc['kind']}: fields the schema does not know were dropped")
    else:
        import kubernetes_validate

        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_every_manifest_is_valid_against_its_schema() -> None:
    docs = _docs()
    assert {d["kind"] for d in docs.values()} == {"Job", "ConfigMap", "PodMonitor", "PrometheusRule",
                                                   "AlertmanagerConfig"}
    for name, doc in docs.items():
        _check(doc)
    listed = yaml.safe_load((KUBE / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(docs)


def _typo(kind: str) -> dict[str, Any]:
    docs = {d["kind"]: d for d in _docs().values()}
    doc = yaml.safe_load(yaml.safe_dump(docs[kind]))
    if kind == "Job":
        doc["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFileSystem"] = True
    elif kind == "PodMonitor":
        doc["spec"]["podMetricsEndpoints"][0]["honourLabels"] = True
    else:
        doc["spec"]["groups"][0]["rules"][0]["expresion"] = "up"
    return doc


@pytest.mark.parametrize("kind", ["Job", "PodMonitor", "PrometheusRule"])
def test_the_schema_checks_catch_a_misspelt_field(kind: str) -> None:
    with pytest.raises(Exception):
        _check(_typo(kind))


def test_the_generated_manifests_are_current_and_hold_the_exported_rules() -> None:
    for name, text in generated(ROOT).items():
        assert (KUBE / name).read_text() == text, f"regenerate: python -m sentinel.kube deploy/kubernetes ({name})"
    rule = yaml.safe_load((KUBE / "prometheusrule.yaml").read_text())
    exported = yaml.safe_load((ROOT / "alerts" / "sentinel.rules.yml").read_text())["groups"]
    job = yaml.safe_load((ROOT / "alerts" / "sentinel.job.rules.yml").read_text())["groups"]
    assert rule["spec"]["groups"] == exported + job
    assert (ROOT / "alerts" / "sentinel.job.rules.yml").read_text() == export_job_rules()
    boards = yaml.safe_load((KUBE / "dashboards-configmap.yaml").read_text())
    assert boards["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert sorted(boards["data"]) == sorted(p.name for p in (ROOT / "dashboards").glob("*.json"))


def test_the_pod_follows_the_conventions_the_docs_state() -> None:
    job = next(d for d in _docs().values() if d["kind"] == "Job")
    pod = job["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    [sidecar] = pod["initContainers"]
    [trainer] = pod["containers"]
    assert sidecar["restartPolicy"] == "Always"  # a native sidecar: the Job ends with the trainer
    for c in (sidecar, trainer):
        assert c["resources"]["requests"] and c["securityContext"]["readOnlyRootFilesystem"] is True
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert "sentinel-socket" in {m["name"] for m in c["volumeMounts"]}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert sidecar[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    socket = sidecar["args"][sidecar["args"].index("--socket") + 1]
    env = {e["name"]: e.get("value") for e in trainer["env"]}
    assert env["SENTINEL_SOCKET"] == socket and trainer["args"][:2] == ["sentinel", "run"]
    # docs/deployment.md: uid 65532 for both, no capabilities, the socket on an in-memory emptyDir
    assert pod["securityContext"]["runAsUser"] == pod["securityContext"]["runAsGroup"] == 65532
    for c in (sidecar, trainer):
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert c["securityContext"].get("runAsUser", 65532) == 65532
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["sentinel-socket"]["emptyDir"]["medium"] == "Memory"
    monitor = next(d for d in _docs().values() if d["kind"] == "PodMonitor")
    assert monitor["spec"]["podMetricsEndpoints"][0]["honorLabels"] is True
    assert monitor["spec"]["selector"]["matchLabels"].items() <= job["spec"]["template"]["metadata"]["labels"].items()


def test_the_configmaps_config_is_a_valid_config_at_the_path_the_daemon_reads(tmp_path: Path) -> None:
    from sentinel.config import load_config

    cm = next(d for d in _docs().values() if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "sentinel-config")
    job = next(d for d in _docs().values() if d["kind"] == "Job")
    [sidecar] = job["spec"]["template"]["spec"]["initContainers"]
    mount = next(m for m in sidecar["volumeMounts"] if m["name"] == "sentinel-config")["mountPath"]
    [name] = cm["data"]
    assert sidecar["args"][sidecar["args"].index("--config") + 1] == f"{mount}/{name}"
    path = tmp_path / name
    path.write_text(cm["data"][name])
    cfg, _ = load_config(path)
    assert cfg.profile == "fleet" and cfg.alertmanager.url is not None
