"""What a framework script records beside its own reference values: the exported ones.

After each optimizer step the script calls :meth:`Probe.step`: it polls the monitor's
/metrics (``SENTINEL_URL`` under ``sentinel run``, else the URL the script hands in) until
``sentinel_step`` (of its run, when the daemon serves several) shows that step, and keeps the exported values next to the reference
the script took where the framework says the value is final; from the fault step on it
also waits for ``TrainingNonFinite``. :meth:`Probe.finish` writes everything to a JSON
file for the test. Only the standard library: under ``sentinel run``
the script must not import sentinel.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
import urllib.request
from collections.abc import Callable
from typing import Any

EXPORTED = ("sentinel_step", "sentinel_grad_norm", "sentinel_grad_norm_preclip", "sentinel_loss")
_SAMPLE = re.compile(r'^(sentinel_\w+)\{([^}]*rank="0"[^}]*)\} (\S+)$', re.M)
_NAME = re.compile(r'name="([^"]*)"')
_RUN = re.compile(r'run="([^"]*)"')


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


def _num(x: Any) -> float | None:
    if x is None:
        return None
    try:
        return float(x.item() if hasattr(x, "item") else x)
    except (TypeError, ValueError):
        return None


class Probe:
    """Pairs reference values with exported ones, per optimizer step."""

    def __init__(self, out: str, fault: str, fault_step: int, url: Callable[[], str | None] | None = None,
                 run: str | None = None) -> None:
        self.out, self.fault, self.fault_step, self.run = out, fault, fault_step, run
        self._url = url or (lambda: os.environ.get("SENTINEL_URL"))
        self.refs: dict[int, dict[str, float | None]] = {}
        self.exported: dict[int, dict[str, Any]] = {}
        self.error: str | None = None
        self.alerts: list[dict[str, Any]] = []

    def ref(self, step: int, **values: Any) -> None:
        self.refs.setdefault(step, {}).update({k: _num(v) for k, v in values.items()})

    def faulty(self, step: int, kind: str) -> bool:
        """True where the script injects the fault ``kind`` (``loss`` or ``grad``)."""
        return self.fault == kind and step == self.fault_step

    def step(self, step: int, timeout: float = 10.0, expect: tuple[str, ...] = ()) -> None:
        """Wait until /metrics shows ``step``; keep what it exports for that step. From the
        fault step on, also wait (a while) for ``TrainingNonFinite`` in /api/v1/alerts, while
        the monitor still serves (an adapter closes it when training ends). Names in
        ``expect`` (values logged for the step after its report left, in a frame of their
        own) are waited for until they show the step's reference value."""
        if self.error is not None:
            return
        url = self._url()
        deadline = time.monotonic() + timeout
        text = ""
        while url is not None and time.monotonic() < deadline:
            text = _get(url + "/metrics")
            values: dict[str, Any] = {}
            for name, labels, value in _SAMPLE.findall(text):
                if self.run is not None and f'run="{self.run}"' not in labels:
                    continue  # another run of the same daemon
                if name in EXPORTED:
                    values[name] = float(value)
                elif name == "sentinel_scalar" and _NAME.search(labels):
                    values["scalar:" + _NAME.search(labels).group(1)] = float(value)  # type: ignore[union-attr]
                if name == "sentinel_step" and _RUN.search(labels):
                    values["run"] = _RUN.search(labels).group(1)  # type: ignore[union-attr]
            ref = self.refs.get(step, {})
            if values.get("sentinel_step") == step and all(
                    values.get(n) is not None and ref.get(n) is not None
                    and abs(values[n] - ref[n]) <= 1e-6 * max(1.0, abs(ref[n])) for n in expect):
                self.exported[step] = {n: values.get(n) for n in EXPORTED} | values
                break
            time.sleep(0.01)
        else:
            steps = re.findall(r"^sentinel_step\{.*$", text, re.M)
            self.error = f"step {step} never showed on /metrics at {url} (sentinel_step: {steps})"
            return
        if self.fault != "none" and step >= self.fault_step and not self.alerts:
            deadline = time.monotonic() + timeout / 2
            while not self.alerts and time.monotonic() < deadline:
                found = json.loads(_get(url + "/api/v1/alerts"))["data"]["alerts"]
                self.alerts = [a for a in found if a["alertname"] == "TrainingNonFinite"
                               and self.run in (None, a.get("run"))]
                time.sleep(0.02)

    def finish(self) -> None:
        with open(self.out, "w") as f:
            json.dump({"refs": {str(k): v for k, v in self.refs.items()},
                       "exported": {str(k): v for k, v in self.exported.items()},
                       "alerts": self.alerts, "error": self.error}, f, allow_nan=True)


def total_norm(params: Any) -> float:
    """The reference: torch's total L2 norm of the gradients, as they are now."""
    import torch

    grads = [p.grad for p in params if p.grad is not None]
    return float(torch.nn.utils.get_total_norm(grads)) if grads else math.nan
