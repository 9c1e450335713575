"""YAML from a file a user names, read so that no file can hang, crash or balloon the process.

A config file is small: at most ``MAX_BYTES`` are read (``/dev/zero`` stops there), the bytes must be
UTF-8 text, nesting stops at ``MAX_DEPTH`` (deep nesting is a RecursionError in the composer
otherwise), the document at ``MAX_NODES`` keys, values and items (a file within the byte cap holding
330,000 list items cost 13 s of CPU and 225 MB to parse, at start and at each reload; the parse stops
at the first node past the cap), and anchors and aliases are refused (a few nested aliases expand to
gigabytes). Every problem is a ``ValueError`` whose message is one line naming the file and, where
known, the line.
"""

from __future__ import annotations

import os
import stat
from functools import cache
from typing import Any

__all__ = ["MAX_BYTES", "MAX_DEPTH", "MAX_NODES", "load_file"]

MAX_BYTES = 1024 * 1024
MAX_DEPTH = 32
# Every key, value and list item counts. The largest files these are: a web config listing some thousand
# basic-auth users (two nodes each); the agent's config with every option set is under 200.
MAX_NODES = 10_000


@cache
def _loader() -> Any:
    """A SafeLoader that refuses anchors and aliases, bounds depth and records each key's line."""
    import yaml

    class BoundedLoader(yaml.SafeLoader):
        depth = 0
        nodes = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            event = self.peek_event()  # type: ignore[no-untyped-call]
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
                raise yaml.MarkedYAMLError(
                    problem="anchors and aliases (& and *) are not accepted", problem_mark=event.start_mark
                )
            self.nodes += 1
            if self.nodes > MAX_NODES:
                raise yaml.MarkedYAMLError(
                    problem=f"more than {MAX_NODES} keys, values and list items; is it the right file?",
                    problem_mark=event.start_mark,
                )
            self.depth += 1
            try:
                if self.depth > MAX_DEPTH:
                    raise yaml.MarkedYAMLError(
                        problem=f"nested deeper than {MAX_DEPTH} levels", problem_mark=event.start_mark
                    )
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    def construct_mapping(loader: BoundedLoader, node: yaml.MappingNode) -> dict[Any, Any]:
        mapping = loader.construct_mapping(node, deep=True)
        lines = {}
        for key_node, _ in node.value:
            lines[loader.construct_object(key_node)] = key_node.start_mark.line + 1
        mapping["__lines__"] = lines
        return mapping

    BoundedLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    return BoundedLoader


def read_text(path: str, max_bytes: int = MAX_BYTES, what: str = "file") -> str:
    """The file's text, or ValueError: unreadable, larger than ``max_bytes``, or not UTF-8."""
    try:
        mode = os.stat(path).st_mode
        if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):  # opening a pipe waits for a writer, maybe forever
            raise ValueError(f"{what} {path} is a pipe or socket, not a file")
        with open(path, "rb") as handle:
            data = handle.read(max_bytes + 1)
    except OSError as exc:
        raise ValueError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise ValueError(f"{what} {path} is larger than {max_bytes // 1024} KiB; is it the right file?")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{what} {path} is not UTF-8 text (byte {exc.start}); is it the right file?") from None


def load_file(path: str, max_bytes: int = MAX_BYTES, what: str = "file") -> Any:
    """Parsed YAML; every mapping carries ``__lines__`` (key -> line number) for error messages."""
    text = read_text(path, max_bytes, what)
    import yaml

    try:
        return yaml.load(text, Loader=_loader())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else path
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ValueError(f"invalid YAML in {where}: {problem}") from None
    except RecursionError:
        raise ValueError(f"invalid YAML in {path}: nested too deeply") from None


def strip_lines(data: Any) -> Any:
    """``data`` without the ``__lines__`` entries."""
    if isinstance(data, dict):
        return {k: strip_lines(v) for k, v in data.items() if k != "__lines__"}
    if isinstance(data, list):
        return [strip_lines(v) for v in data]
    return data
