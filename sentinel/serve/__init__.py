"""What the engine serves over HTTP: ``/metrics`` (the Prometheus exporter),
``/api/v1/alerts``, ``/healthz`` and the status page."""
