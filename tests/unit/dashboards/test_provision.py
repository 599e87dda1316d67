"""`sentinel dashboards provision` against a local HTTP server that records every request
and checks it against the shapes of Grafana's HTTP API (folders, datasources, dashboard
upsert with overwrite, annotations). No Grafana server can be installed on these machines:
this stand-in is the one fake the tests allow, and it answers as Grafana 11.6 does."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from typer.testing import CliRunner

from sentinel.cli import app
from sentinel.dashboards import links

TOKEN = "glsa_s3cr3t-token-value"


class FakeGrafana:
    """Folders, datasources, dashboards and annotations in memory; Bearer auth."""

    def __init__(self, version: str = "11.6.0") -> None:
        self.version = version
        self.requests: list[tuple[str, str, Any]] = []
        self.folders: dict[str, dict[str, Any]] = {}
        self.datasources: dict[str, dict[str, Any]] = {}
        self.dashboards: dict[str, dict[str, Any]] = {}
        self.annotations: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _body(self) -> Any:
                n = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(n)) if n else None

            def _send(self, code: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, method: str) -> None:
                body = self._body() if method in ("POST", "PUT") else None
                path = self.path.split("?")[0]
                outer.requests.append((method, path, body))
                if path == "/api/health":
                    return self._send(200, {"database": "ok", "version": outer.version, "commit": "abc"})
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    return self._send(401, {"message": "invalid API key"})
                code, reply = outer.route(method, path, body)
                self._send(code, reply)

            def do_GET(self) -> None:  # noqa: N802
                self._handle("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._handle("POST")

            def do_PUT(self) -> None:  # noqa: N802
                self._handle("PUT")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def route(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "folders"]:
            if method == "GET" and len(parts) == 3:
                f = self.folders.get(parts[2])
                return (200, f) if f else (404, {"message": "folder not found"})
            if method == "POST" and len(parts) == 2:
                assert isinstance(body["title"], str) and isinstance(body["uid"], str)
                self.folders[body["uid"]] = {"uid": body["uid"], "title": body["title"], "id": 1}
                return 200, self.folders[body["uid"]]
        if parts[:3] == ["api", "datasources", "uid"] and len(parts) == 4:
            uid = parts[3]
            if method == "GET":
                d = self.datasources.get(uid)
                return (200, d) if d else (404, {"message": "Data source not found"})
            if method == "PUT":
                self.datasources[uid] = {**body, "id": 1}
                return 200, {"message": "Datasource updated"}
        if parts[:2] == ["api", "datasources"] and method == "POST" and len(parts) == 2:
            assert {"name", "type", "url", "access", "uid"} <= set(body) and body["type"] == "prometheus"
            self.datasources[body["uid"]] = {**body, "id": 1}
            return 200, {"message": "Datasource added", "id": 1}
        if parts[:3] == ["api", "dashboards", "uid"] and method == "GET":
            d = self.dashboards.get(parts[3])
            return (200, d) if d else (404, {"message": "Dashboard not found"})
        if parts[:3] == ["api", "dashboards", "db"] and method == "POST":
            dash = body["dashboard"]  # Grafana's shape: {dashboard, folderUid, overwrite, message}
            assert body["overwrite"] is True and isinstance(body["folderUid"], str)
            assert body["folderUid"] in self.folders, "the folder must exist before its dashboards"
            assert dash["uid"] and dash["title"] and isinstance(dash["panels"], list) and dash.get("id") is None
            old = self.dashboards.get(dash["uid"])
            version = (old["dashboard"]["version"] + 1) if old else 1
            self.dashboards[dash["uid"]] = {"dashboard": {**dash, "id": 7, "version": version},
                                            "meta": {"folderUid": body["folderUid"]}}
            return 200, {"status": "success", "uid": dash["uid"], "version": version}
        if parts[:2] == ["api", "annotations"] and method == "POST":
            assert isinstance(body["time"], int) and isinstance(body["timeEnd"], int)
            assert all(isinstance(t, str) for t in body["tags"]) and isinstance(body["text"], str)
            self.annotations.append(body)
            return 200, {"message": "Annotation added", "id": len(self.annotations)}
        return 404, {"message": "not found"}

    def writes(self) -> list[tuple[str, str]]:
        return [(m, p) for m, p, _ in self.requests if m in ("POST", "PUT", "DELETE")]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def grafana() -> Iterator[FakeGrafana]:
    g = FakeGrafana()
    yield g
    g.stop()


def _provision(url: str, *extra: str, token: str = TOKEN) -> Any:
    return CliRunner().invoke(app, ["dashboards", "provision", "--grafana-url", url, "--token-env",
                                    "MY_GRAFANA_TOKEN", *extra], env={"MY_GRAFANA_TOKEN": token})


def test_provision_creates_then_changes_nothing(grafana: FakeGrafana) -> None:
    first = _provision(grafana.url, "--folder", "Training", "--prometheus-url", "http://prometheus:9090",
                       "--from", "dashboards")
    assert first.exit_code == 0, first.output
    assert "folder 'Training': created" in first.output and "datasource sentinel-prometheus: created" in first.output
    assert set(grafana.dashboards) == {"sentinel-overview", "sentinel-layers", "sentinel-optimizer-memory",
                                       "sentinel-ranks-gpus"}
    assert all(d["meta"]["folderUid"] == "sentinel" for d in grafana.dashboards.values())
    assert grafana.datasources["sentinel-prometheus"]["url"] == "http://prometheus:9090"
    assert TOKEN not in first.output

    grafana.requests.clear()
    second = _provision(grafana.url, "--folder", "Training", "--prometheus-url", "http://prometheus:9090",
                        "--from", "dashboards")
    assert second.exit_code == 0, second.output
    assert "nothing changed" in second.output
    assert grafana.writes() == []  # idempotent: only reads


def test_a_changed_dashboard_is_overwritten(grafana: FakeGrafana) -> None:
    assert _provision(grafana.url, "--from", "dashboards").exit_code == 0
    grafana.dashboards["sentinel-layers"]["dashboard"]["title"] = "edited by hand"
    again = _provision(grafana.url, "--from", "dashboards")
    assert again.exit_code == 0 and "dashboard sentinel-layers: updated" in again.output
    assert grafana.writes()[-1] == ("POST", "/api/dashboards/db")
    assert grafana.dashboards["sentinel-layers"]["dashboard"]["title"] == "Sentinel / Layers"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(("case", "message"), [
    ("bad-token", "refused the token (HTTP 401)"),
    ("unreachable", "cannot reach Grafana"),
    ("old", "version 10.4.1; the dashboards need 11.0 or newer"),
])
def test_errors_are_one_line_exit_2_and_never_show_the_token(grafana: FakeGrafana, case: str, message: str) -> None:
    url, token = grafana.url, TOKEN
    if case == "bad-token":
        token = "glsa_wrong-token-value"
    elif case == "unreachable":
        url = f"http://127.0.0.1:{_closed_port()}"
    else:
        grafana.version = "10.4.1"
    result = _provision(url, "--from", "dashboards", token=token)
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], result.output
    assert token not in result.output and "Traceback" not in result.output
    assert grafana.dashboards == {}


def test_annotation_payload_is_what_grafana_accepts(grafana: FakeGrafana) -> None:
    """What a Grafana sink will post, through grafana-client, for a firing and a resolved alert."""
    from grafana_client import GrafanaApi

    api = GrafanaApi.from_url(grafana.url, credential=TOKEN)
    alert = {"alertname": "LossSpike", "severity": "warning", "state": "firing", "job": "train", "run": "exp-42",
             "summary": "Loss spiked", "started_at": 1700000000.0, "resolved_at": None}
    api.client.POST("/annotations", json=links.annotation(alert))
    api.client.POST("/annotations", json=links.annotation({**alert, "state": "resolved",
                                                          "resolved_at": 1700000060.0}))
    fired, resolved = grafana.annotations
    assert fired["time"] == fired["timeEnd"] == 1700000000000
    assert (resolved["time"], resolved["timeEnd"]) == (1700000000000, 1700000060000)
    assert {"sentinel", "alertname:LossSpike", "severity:warning", "run:exp-42"} <= set(fired["tags"])
