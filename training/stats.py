"""What the tokenize job read, wrote, dropped and checked: the stats, and how they are printed."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console


@dataclass
class TokenizeStats:
    """What the job read, wrote, dropped and checked; also written to ``stats.json``."""

    input: str
    output: str
    tokenizer: str
    tokenizer_vocab_size: int
    target_vocab_size: int
    template: str
    options: dict[str, Any]
    lines: int = 0
    records: int = 0
    bad_rows: int = 0
    bad_examples: list[dict[str, Any]] = field(default_factory=list)
    duplicates: int = 0
    rows_out: int = 0
    tokens: int = 0
    masked_tokens: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    cut_rows: int = 0
    flagged_truncated: int = 0
    split_conversations: int = 0
    spliced_turns: int = 0
    reasoning_dropped_turns: int = 0
    unmasked_turns: int = 0
    prompt_checks: int = 0
    prompt_mismatches: int = 0
    mismatch_examples: list[dict[str, Any]] = field(default_factory=list)
    # Rows built from the server's token ids, and those unlike the template's row (drift).
    rows_from_ids: int = 0
    drift_checks: int = 0
    drift_rows: int = 0
    drift_examples: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """Return the stats as a JSON-ready dict."""
        return asdict(self)


def print_stats(stats: TokenizeStats, console: Console) -> None:
    """Print the stats table, then warnings for bad rows and prompt-token mismatches."""
    from rich.table import Table

    table = Table(title="eaglegen tokenize", show_header=False)
    for label, value in _stat_lines(stats):
        table.add_row(label, value)
    console.print(table)
    if stats.bad_rows:
        where = ", ".join(f"line {b['line']}: {b['reason']}" for b in stats.bad_examples[:3])
        console.print(f"[yellow]warning:[/] {stats.bad_rows} bad rows skipped ({where})")
    if stats.reasoning_dropped_turns:
        console.print(
            f"[yellow]warning:[/] {stats.reasoning_dropped_turns} turns carry reasoning the chat "
            "template does not render; those rows hold the answers without it"
        )
    if stats.prompt_mismatches:
        ids = ", ".join(f"{m['id']} (turn {m['turn']})" for m in stats.mismatch_examples)
        console.print(
            f"[yellow]warning:[/] {stats.prompt_mismatches} of {stats.prompt_checks} turns have a "
            f"prompt token count unlike the server's, e.g. {ids}: the chat template probably "
            "differs from the one used for generation"
        )
    if stats.drift_rows:
        from rich.markup import escape

        console.print(f"[yellow]warning:[/] {escape(_drift_line(stats))}")


def _drift_line(s: TokenizeStats) -> str:
    """One line on the rows from ids that differ from the template's, with the first case."""
    line = f"{s.drift_rows} of {s.drift_checks} rows from token ids differ from the template's"
    first = s.drift_examples[0] if s.drift_examples else None
    if first is None:
        return line
    if first["what"] == "template":
        return f"{line}; first {first['id']}: {first['reason']}"
    return (
        f"{line}; first {first['id']} at token {first['position']} ({first['what']}): "
        f"ids {first['ids']!r} vs template {first['template']!r}"
    )


def _stat_lines(s: TokenizeStats) -> list[tuple[str, str]]:
    """Return the (label, value) lines of the stats table."""
    dropped = ", ".join(f"{k} {v}" for k, v in sorted(s.dropped.items())) or "0"
    share = f" ({s.masked_tokens / s.tokens:.1%})" if s.tokens else ""
    return [
        ("lines read", str(s.lines)),
        ("records", str(s.records)),
        ("bad rows", str(s.bad_rows)),
        ("duplicate ids skipped", str(s.duplicates)),
        ("rows out", str(s.rows_out)),
        ("tokens", str(s.tokens)),
        ("masked tokens", f"{s.masked_tokens}{share}"),
        ("rows dropped", dropped),
        ("rows cut at a turn", str(s.cut_rows)),
        ("rows flagged truncated", str(s.flagged_truncated)),
        ("conversations split per turn", str(s.split_conversations)),
        ("turns spliced (reasoning)", str(s.spliced_turns)),
        ("turns whose reasoning the template drops", str(s.reasoning_dropped_turns)),
        ("turns not trained (history rewritten)", str(s.unmasked_turns)),
        ("prompt-token mismatches", f"{s.prompt_mismatches} of {s.prompt_checks}"),
        ("rows from token ids", str(s.rows_from_ids)),
        ("rows from ids unlike the template", f"{s.drift_rows} of {s.drift_checks}"),
        ("seconds", f"{s.seconds:.1f}"),
    ]
