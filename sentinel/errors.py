"""The errors every floor of the package may raise or catch (the ground floor: it imports
nothing of the package). A bad config is found by the daemon side and must reach the
training side's ``watch()`` as itself."""

from __future__ import annotations

import difflib
from collections.abc import Sequence


class ConfigError(Exception):
    """Invalid configuration; ``str()`` is one ``dotted.key: message`` line per problem.

    Attributes:
        problems: the lines.
    """

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


def did_you_mean(key: str, known: Sequence[str]) -> str:
    """``" (did you mean 'x'?)"`` for the known name closest to a misspelt ``key``, or ``""``:
    a config key, a rule's name, a ``sentinel.watch`` option."""
    near = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return f" (did you mean {near[0]!r}?)" if near else ""
