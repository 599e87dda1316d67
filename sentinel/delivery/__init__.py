"""Alert delivery: routes, the durable outbox and its sinks (apprise, Alertmanager).

- :mod:`~sentinel.delivery.routes`: which alerts go where, cooldowns, rate limits;
- :mod:`~sentinel.delivery.outbox`: the SQLite outbox, written before anything is sent;
- :mod:`~sentinel.delivery.courier`: stores transitions, delivers them with retries;
- :mod:`~sentinel.delivery.sinks`: apprise URLs and Alertmanager's v2 API;
- :mod:`~sentinel.delivery.messages`: titles and bodies;
- :mod:`~sentinel.delivery.secrets`: URL parsing and redaction.

Senders return a bool and never raise.
"""

from sentinel.delivery.courier import Courier, notice_of
from sentinel.delivery.outbox import Outbox
from sentinel.delivery.routes import Route, build_routes

__all__ = ["Courier", "Outbox", "Route", "build_routes", "notice_of"]
