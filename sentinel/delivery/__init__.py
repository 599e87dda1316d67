"""Alert delivery: apprise for chat and pagers (routes, the outbox and other sinks go here).

Senders return a bool and never raise."""

from sentinel.delivery.apprise_sink import AppriseNotifier, Dispatcher, render

__all__ = ["AppriseNotifier", "Dispatcher", "render"]
