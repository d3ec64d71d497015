"""Write docs/settings.md from the Settings object, so the page cannot drift from the code.

Each row is one field of ``common.settings.Settings``: its variable, type, default and meaning.
The meaning is the comment written at the field (on its line, else the comment block above it,
without a section heading such as ``# Worker.``); ``MEANING`` supplies it where the comment is
missing or says why rather than what.

    python scripts/settings_doc.py            # rewrite docs/settings.md
    python scripts/settings_doc.py --check    # exit 1 if the page is out of date
"""

from __future__ import annotations

import argparse
import ast
import io
import sys
import tokenize
import types
import typing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.settings import Settings  # noqa: E402

SOURCE = ROOT / "common" / "settings.py"
PAGE = ROOT / "docs" / "settings.md"

# Where the field's own comment is missing, or explains a choice rather than the setting.
MEANING = {
    "redis_url": "the Redis of the broker and of every run's state; a password in it is never "
    "logged (`redis://`, `rediss://`, `sentinel://`: docs/deployment.md)",
    "endpoints": "the model servers: OpenAI base URLs ending in `/v1`, comma-separated",
    "model": "the model name to request; unset: the first id of the server's `GET /v1/models`",
    "api_key": "sent as the bearer token; never printed or logged",
    "run": "the run name: namespaces every Redis key of a run",
    "queue": "the Celery queue; a run is served by the queue it was enqueued on",
    "key_prefix": "the first part of every Redis key",
    "concurrency": "requests in flight per worker process (its threads)",
    "connect_timeout": "seconds to open a connection to an endpoint",
    "checkpoint_seconds": "the time bound of `EAGLEGEN_CHECKPOINT_TOKENS`: a streaming turn is "
    "saved at least this often",
    "lease_ttl": "seconds a sample's lease lives without renewal; a dead worker's samples run "
    "again within this plus `EAGLEGEN_RECONCILE_INTERVAL`",
    "max_inflight": "requests at once per endpoint, all workers together; set it to the "
    "server's `--max-num-seqs` plus about 10%",
    "endpoint_caps": "per-endpoint overrides of `EAGLEGEN_MAX_INFLIGHT`",
    "slot_ttl": "seconds before a dead worker's endpoint slot frees itself",
    "endpoint_failures": "connect errors or 5xx in a row that take an endpoint out",
    "endpoint_cooldown": "seconds to an endpoint's first probe once out (doubling after each "
    "failed probe)",
    "adaptive_headroom": "requests the adaptive mode lets wait at a server, per request running",
    "max_retries": "transient failures of a sample before it is failed",
    "backoff_base": "the first retry's backoff ceiling in seconds (exponential, full jitter)",
    "backoff_max": "the largest backoff between retries, seconds",
    "reconcile_interval": "seconds between reconciler passes",
    "visibility_timeout": "seconds before Redis redelivers an unacknowledged task; every broker "
    "client must use the same",
    "adaptive_interval": "seconds between two reads of a server's `/metrics` (adaptive caps)",
    "adaptive_max_inflight": "the largest cap the adaptive mode sets",
    "metrics_host": "the address a worker's Prometheus endpoint binds to",
    "max_pending": "producer backpressure: samples queued and not yet done, at most",
    "collect_batch": "results the collector writes and fsyncs at once, at most",
    "collector_lock_ttl": "seconds a collector's run lock lives without renewal (a successor "
    "waits that long)",
}
DEFAULT = {
    "model": "from the server",
    "visibility_timeout": "max request time + backoff max + 600",
}
HEADER = """# Settings

Every setting is an environment variable `EAGLEGEN_<FIELD>` (or a line of `.env`), read once
per process into the `Settings` object of `common/settings.py`, which every part receives. In
tests and scripts, pass them as keyword arguments instead: `Settings(lease_ttl=6)`.

This page is generated from that object by `python scripts/settings_doc.py` (a test fails when
they disagree); edit the comments in `common/settings.py`, not this page.

| variable | type | default | meaning |
|---|---|---|---|
"""


def field_comments(source: str) -> dict[str, str]:
    """Field name -> the comment written at it in the Settings class."""
    lines = source.splitlines()
    trailing = _trailing_comments(source)
    tree = ast.parse(source)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Settings")
    out: dict[str, str] = {}
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            ends = range(node.lineno, (node.end_lineno or node.lineno) + 1)
            text = next((trailing[n] for n in ends if n in trailing), None)
            out[node.target.id] = text or _block_above(lines, node.lineno)
    return out


def _trailing_comments(source: str) -> dict[int, str]:
    """Line number -> a comment that follows code on that line."""
    out: dict[int, str] = {}
    code_lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and tok.start[0] in code_lines:
            out[tok.start[0]] = _clean(tok.string)
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            code_lines.add(tok.start[0])
    return {n: text for n, text in out.items() if not text.startswith("fmt:")}


def _block_above(lines: list[str], lineno: int) -> str:
    """The comment lines right above line ``lineno`` (1-based), without a section heading."""
    block: list[str] = []
    index = lineno - 2
    while index >= 0 and lines[index].strip().startswith("#"):
        block.insert(0, _clean(lines[index].strip()))
        index -= 1
    if block and _is_heading(block[0]):
        block = block[1:]
    return " ".join(block)


def _is_heading(line: str) -> bool:
    """``# Worker.``, ``# Where things are.``: a few words naming the fields that follow."""
    return len(line.split()) <= 4 and line.endswith(".") and ":" not in line


def _clean(comment: str) -> str:
    return comment.lstrip("#").strip()


def type_name(annotation: Any, metadata: list[Any]) -> str:
    """The field's type as a reader writes the variable: ``int ≥ 1``, ``auto | on | off``."""
    optional = False
    args = typing.get_args(annotation)
    if isinstance(annotation, types.UnionType) and type(None) in args:
        optional = True
        annotation = next(a for a in args if a is not type(None))
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        name = " | ".join(f"`{value}`" for value in typing.get_args(annotation))
    elif origin is list:
        name = "list, comma-separated"
    elif origin is dict:
        name = "`URL=N,URL=N`"
    else:
        name = {"SecretStr": "secret"}.get(annotation.__name__, annotation.__name__)
    bounds = [_bound(item) for item in metadata if _bound(item)]
    name = " ".join([name, ", ".join(bounds)]).strip()
    return f"{name}, optional" if optional else name


def _bound(item: Any) -> str:
    for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
        if getattr(item, attr, None) is not None:
            return f"{sign} {getattr(item, attr)}"
    return ""


def default_text(name: str) -> str:
    """The default as it would be written in the variable."""
    if name in DEFAULT:
        return DEFAULT[name]
    field = Settings.model_fields[name]
    value = field.default_factory() if field.default_factory else field.default
    if value is None or value == {}:
        return "none"
    if isinstance(value, list):
        value = ",".join(value)
    if isinstance(value, bool):
        value = str(value).lower()
    return f"`{value}`"


def render() -> str:
    """The whole page, one row per Settings field, in the order of the class."""
    comments = field_comments(SOURCE.read_text(encoding="utf-8"))
    rows = []
    for name, field in Settings.model_fields.items():
        meaning = MEANING.get(name) or comments.get(name, "")
        if not meaning:
            raise SystemExit(f"Settings.{name} has no comment: write one in common/settings.py")
        cells = [
            f"`EAGLEGEN_{name.upper()}`",
            type_name(field.annotation, field.metadata),
            default_text(name),
            meaning,
        ]
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return HEADER + "\n".join(rows) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the page is out of date")
    args = parser.parse_args()
    page = render()
    if args.check:
        current = PAGE.read_text(encoding="utf-8") if PAGE.exists() else ""
        if current != page:
            print(f"{PAGE.relative_to(ROOT)} is out of date: run python scripts/settings_doc.py")
            return 1
        return 0
    PAGE.write_text(page, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)} ({len(Settings.model_fields)} settings)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
