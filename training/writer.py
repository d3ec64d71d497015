"""The job's output side: merge each line's outcome into the stats and write its rows."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from training.rows import Outcome
from training.sink import DatasetSink, OutRow
from training.stats import TokenizeStats

_EXAMPLES = 5
_BAD_EXAMPLES = 20


class RowWriter:
    """Main-process side: merges outcomes into stats and writes rows and conversations."""

    def __init__(self, stats: TokenizeStats, conversations: Any, flag: bool) -> None:
        """Start with empty id set; rows go to the dataset and the conversations file."""
        self.stats = stats
        self.conversations = conversations
        self.flag = flag
        self.seen: set[str] = set()

    def merge(self, outcome: Outcome) -> list[OutRow]:
        """Count one outcome and return the rows to write (none for bad or duplicate lines)."""
        s = self.stats
        s.lines += 1
        if outcome.error is not None or outcome.record_id is None:
            s.bad_rows += 1
            if len(s.bad_examples) < _BAD_EXAMPLES:
                s.bad_examples.append({"line": outcome.line, "reason": outcome.error})
            return []
        if outcome.record_id in self.seen:
            s.duplicates += 1
            return []
        self.seen.add(outcome.record_id)
        s.records += 1
        for reason in outcome.dropped:
            s.dropped[reason] = s.dropped.get(reason, 0) + 1
        s.cut_rows += outcome.cut
        s.split_conversations += outcome.split
        s.spliced_turns += outcome.spliced
        s.reasoning_dropped_turns += outcome.reasoning_dropped
        s.unmasked_turns += outcome.unmasked
        s.prompt_checks += outcome.checks
        s.prompt_mismatches += len(outcome.mismatches)
        room = _EXAMPLES - len(s.mismatch_examples)
        s.mismatch_examples.extend(outcome.mismatches[: max(room, 0)])
        s.rows_from_ids += outcome.from_ids
        s.drift_checks += outcome.drift_checks
        s.drift_rows += len(outcome.drift)
        room = _EXAMPLES - len(s.drift_examples)
        s.drift_examples.extend(outcome.drift[: max(room, 0)])
        return outcome.rows

    def drain(
        self,
        chunks: Iterator[tuple[int, list[Outcome]]],
        sink: DatasetSink,
        progress: Any,
        task: Any,
    ) -> None:
        """Write every chunk's rows to the dataset and the conversations file, counting them."""
        s = self.stats
        for done, outcomes in chunks:
            rows = [row for outcome in outcomes for row in self.merge(outcome)]
            for row in rows:
                s.tokens += len(row.input_ids)
                s.masked_tokens += int(row.loss_mask.sum())
                s.flagged_truncated += row.truncated and self.flag
            s.rows_out += len(rows)
            self.conversations.writelines(row.conversation + "\n" for row in rows)
            sink.write(rows)
            progress.update(task, completed=done, rows=s.rows_out)
