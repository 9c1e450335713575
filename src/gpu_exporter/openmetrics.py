"""OpenMetrics 1.0 for the clients that ask for it (``Accept: application/openmetrics-text``, which
Prometheus sends first by default).

The agent's page is made once per sample scraped, in the Prometheus text format; ``convert`` turns that text
into OpenMetrics by rewriting metadata lines only (sample lines are the same in both formats): a
counter's family drops the ``_total`` its samples keep, ``untyped`` becomes ``unknown``, a double quote
in HELP is escaped, and the page ends with ``# EOF``.
"""

from __future__ import annotations

import re

__all__ = ["CONTENT_TYPE", "accepts_openmetrics", "convert"]

CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
_TYPE = re.compile(r"^# TYPE (\S+) (\S+)$", re.MULTILINE)
_META = re.compile(r"^# (HELP|TYPE) (\S+)(?: (.*))?$", re.MULTILINE)


def accepts_openmetrics(header: str | None) -> bool:
    """True when ``Accept`` prefers OpenMetrics 1.0.0 (or an unversioned or 0.0.1 one) to the text format.

    The media type with the highest q-value wins; at equal q-values the first listed, as Prometheus
    orders its own header by preference."""
    best_q, best_is_om = 0.0, False
    for item in (header or "").split(","):
        media, *params = (part.strip() for part in item.split(";"))
        q, version = 1.0, ""
        for param in params:
            key, _, value = param.partition("=")
            key = key.strip().lower()
            if key == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
            elif key == "version":
                version = value.strip()
        media = media.lower()
        is_om = media == "application/openmetrics-text" and version in ("", "1.0.0", "0.0.1")
        if not is_om and media not in ("text/plain", "*/*", "text/*"):
            continue
        if q > best_q:
            best_q, best_is_om = q, is_om
    return best_is_om


def convert(text: str) -> str:
    """The Prometheus text ``text`` (version 0.0.4) as OpenMetrics 1.0, ending in ``# EOF``."""
    types = {name: kind for name, kind in _TYPE.findall(text)}

    def family(name: str) -> str:
        if types.get(name) == "counter" and name.endswith("_total"):
            return name[: -len("_total")]
        return name

    def rewrite(match: re.Match[str]) -> str:
        keyword, name, rest = match.group(1), match.group(2), match.group(3) or ""
        if keyword == "TYPE":
            kind = rest
            if kind == "untyped" or (kind == "counter" and not name.endswith("_total")):
                kind = "unknown"  # OpenMetrics counters' samples end in _total
            return f"# TYPE {family(name)} {kind}"
        return f"# HELP {family(name)} {_help(rest)}"

    body = _META.sub(rewrite, text)
    if body and not body.endswith("\n"):
        body += "\n"
    return body + "# EOF\n"


def _help(text: str) -> str:
    """Text-format HELP (backslash and newline escaped) to OpenMetrics (double quote escaped too)."""
    out = []
    escaped = False
    for char in text:
        if escaped:
            out.append(char)
            escaped = False
        elif char == "\\":
            out.append(char)
            escaped = True
        elif char == '"':
            out.append('\\"')
        else:
            out.append(char)
    return "".join(out)
