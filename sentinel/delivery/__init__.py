"""Alert delivery: apprise for chat and pagers. Senders return a bool and never raise."""

from sentinel.notify.apprise_notifier import AppriseNotifier, Dispatcher, render

__all__ = ["AppriseNotifier", "Dispatcher", "render"]
