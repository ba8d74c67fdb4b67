"""Untrusted strings stay inert: what a peer wrote is shown as data, never acted on (issue 47).

Some of the strings Quorum shows a person were chosen by a peer: the `reason` of a site's error,
its `device` at join, a plain-mode connection's routing id, what a shuffler or an attack report
quotes of them. They reach events.jsonl, results.csv and the other tables, summary.json,
trace.json, timeline.png and the terminal. There, a newline would let a site forge a line of a
log or of the terminal, an ANSI escape would recolour or rewrite the terminal, rich markup
("[bold red]...") would be live in a rich table, a "$...$" would be parsed as mathtext by
matplotlib (and a malformed one would stop the plot), and an unbounded string would flood all of
them. The wire bounds these strings (protocol.wire); every output passes what it shows through
`inert` as well, so that a bound or a check forgotten upstream, or an old run directory, cannot
undo it:

    inert(text, limit)        one line of printable characters, at most `limit` of them: every
                              character that is not printable (control characters, line and
                              paragraph separators, ANSI escapes, bidirectional overrides,
                              lone surrogates) becomes its backslash escape ("\\n", "\\x1b",
                              "\\u202e"); a longer text is cut, ending in "..."
    inert_all(value, limit)   the same for every string, keys included, inside a JSON-like
                              value (events, summary.json, attack rows)
    plot_label(text, limit)   `inert`, with "$" escaped for matplotlib (no mathtext)

Rich output takes inert text as `rich.text.Text`, which never reads markup (runner.report).
"""

from __future__ import annotations

from typing import Any

#: the longest string any output keeps of what a peer sent (events.jsonl kept 1,000 characters
#: of a reason before; the wire admits no longer reason)
MAX_SHOWN_CHARS = 1000
#: the longest name (a site id, a device) shown where a name is expected: a track, a tick label
MAX_NAME_CHARS = 64

_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def inert(text: Any, limit: int | None = MAX_SHOWN_CHARS) -> str:
    """`text` (str() of anything else) as one line of printable characters, cut to `limit`
    characters (None: not cut). Costs one `isprintable` scan when there is nothing to change,
    so that the ledger and the event log can call it on every row."""
    if not isinstance(text, str):
        text = str(text)
    if not text.isprintable():
        text = "".join(c if c.isprintable() else _escape(c) for c in text)
    if limit is None or len(text) <= limit:
        return text
    return text[:limit - 3] + "..." if limit > 3 else text[:limit]


def inert_all(value: Any, limit: int | None = MAX_SHOWN_CHARS) -> Any:
    """A copy of a JSON-like value (maps, lists, tuples, scalars) whose strings, keys included,
    are `inert`; anything else is returned as it is."""
    if isinstance(value, str):
        return inert(value, limit)
    if isinstance(value, dict):
        return {inert(k, limit) if isinstance(k, str) else k: inert_all(v, limit) for k, v in value.items()}
    if isinstance(value, list):
        return [inert_all(v, limit) for v in value]
    if isinstance(value, tuple):
        return tuple(inert_all(v, limit) for v in value)
    return value


def plot_label(text: Any, limit: int | None = MAX_NAME_CHARS) -> str:
    """A label for matplotlib: `inert`, with every "$" escaped, so that no part of it is parsed
    as mathtext (a site id chosen as "$\\frac$" would otherwise stop the drawing)."""
    return inert(text, limit).replace("$", r"\$")


def _escape(char: str) -> str:
    """The backslash escape of one character that is not printable, as Python's repr writes it."""
    if char in _ESCAPES:
        return _ESCAPES[char]
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
