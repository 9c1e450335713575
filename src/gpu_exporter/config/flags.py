"""The command-line parser every command uses (the agent, ``bridge``, ``doctor``, ``tail``).

argparse as it comes prints the whole usage (some 40 lines for the agent) before a bad flag's error, and
takes any unambiguous prefix of a flag as the flag (``--fake.gpu=3`` runs as ``--fake.gpus=3``), so a
typo in a DaemonSet's args changes behaviour instead of stopping it. Here a usage error is one line on
stderr, naming the closest flag when there is one, and exit 2; a flag is taken only as written.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Sequence
from typing import Any, NoReturn

__all__ = ["FlagParser", "closest"]

USAGE_ERROR = 2


def closest(word: str, candidates: Sequence[str]) -> str | None:
    """The candidate nearest to ``word`` (a flag without its ``=value``), if one is near enough."""
    found = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return found[0] if found else None


class FlagParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` without abbreviations, whose errors are one line: ``PROG: message``.

    ``words`` are further things the command takes in the first place (the agent's subcommand names),
    offered as the closest match too."""

    def __init__(self, *args: Any, words: Sequence[str] = (), **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)
        self.words = tuple(words)

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        parsed, unknown = self.parse_known_args(args, namespace)
        if unknown:
            self.error(self.unknown_message(unknown))
        return parsed

    def unknown_message(self, unknown: Sequence[str]) -> str:
        """``unrecognized argument --fake.gpu=3 (did you mean --fake.gpus?)``: the first one (what
        follows it may be its value)."""
        first = unknown[0]
        message = f"unrecognized argument {first}"
        flags = [s for action in self._actions for s in action.option_strings if s.startswith("--")]
        guess = closest(first.split("=", 1)[0], flags) if first.startswith("-") else closest(first, self.words)
        if guess is not None:
            message += f" (did you mean {guess}?)"
        return message

    def error(self, message: str) -> NoReturn:
        """One line, ``PROG: message`` (no usage: ``--help`` shows it), and exit 2."""
        self.exit(USAGE_ERROR, f"{self.prog}: {message}\n")
