"""The baseline: a regeneration script written the way the origin one was.

One asyncio process, one AsyncOpenAI client, an ``asyncio.Semaphore`` at a fixed concurrency,
non-streaming requests (``--stream``: streamed, the deltas joined as they come, as EagleGen
reads them), each answer appended to a JSONL file as it finishes. No queue, no retries beyond
the SDK's, no shared cap: the shape of the scripts EagleGen replaces.

    .venv/bin/python bench/baseline_asyncio.py --endpoint http://127.0.0.1:8000/v1 \\
        --input prompts.jsonl --out answers.jsonl --concurrency 64 [--stream]

Prints one JSON line: samples, seconds (first request to last line written), samples/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

from openai import AsyncOpenAI


async def answer(
    client: AsyncOpenAI, row: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    """One prompt's answer, as the origin script asked for it."""
    messages = [{"role": "user", "content": row["prompt"]}]
    if args.stream:
        content = await streamed(client, messages, args)
    else:
        response = await client.chat.completions.create(
            model=args.model, messages=messages, max_tokens=args.max_tokens, temperature=0.0
        )
        content = response.choices[0].message.content
    return {
        "id": row.get("id"),
        "conversations": [*messages, {"role": "assistant", "content": content}],
    }


async def streamed(
    client: AsyncOpenAI, messages: list[dict[str, Any]], args: argparse.Namespace
) -> str:
    """One answer streamed, its content deltas joined."""
    stream = await client.chat.completions.create(
        model=args.model, messages=messages, max_tokens=args.max_tokens, temperature=0.0,
        stream=True,
    )  # fmt: skip
    parts = []
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
    return "".join(parts)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Answer every prompt with at most ``concurrency`` requests in flight."""
    rows = [json.loads(line) for line in Path(args.input).read_text().splitlines() if line]
    client = AsyncOpenAI(base_url=args.endpoint, api_key="EMPTY", timeout=600, max_retries=2)
    gate = asyncio.Semaphore(args.concurrency)
    started = time.monotonic()
    with Path(args.out).open("a", encoding="utf-8") as out:

        async def one(row: dict[str, Any]) -> None:
            async with gate:
                record = await answer(client, row, args)
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
            out.flush()

        await asyncio.gather(*(one(row) for row in rows))
    elapsed = time.monotonic() - started
    await client.close()
    return {
        "samples": len(rows),
        "seconds": round(elapsed, 3),
        "samples_per_s": round(len(rows) / elapsed, 2),
    }


def main() -> None:
    """Parse the command line, run, print the figures as one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--model", default="eaglegen-sim")
    parser.add_argument("--input", required=True, help="JSONL with a 'prompt' per line")
    parser.add_argument("--out", required=True)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=2048)
    parser.add_argument("--stream", action="store_true", help="streamed requests")
    print(json.dumps(asyncio.run(run(parser.parse_args()))))


if __name__ == "__main__":
    main()
