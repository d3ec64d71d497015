"""Write the bundled tool-calling sample: data/tool_calls_openai.jsonl and
data/tool_calls_sharegpt.json (single, parallel and multi-step calls, mismatches, bad rows).

    python scripts/tool_calls_sample.py

The conversations follow the simulator's rule (simulator/tool_calls.py): the functions a
user message or a tool result names are the ones called next. A "mismatch" row's source calls
another function than the one its message names, so its conversation stops there.
"""

from __future__ import annotations

import json
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "data"
CITIES = ("Oslo", "Lima", "Kyoto", "Accra", "Quito", "Perth", "Turin", "Porto", "Hanoi", "Cusco")


def _fn(name: str, description: str, **props: dict) -> dict:
    params = {"type": "object", "properties": props, "required": list(props)}
    return {"name": name, "description": description, "parameters": params}


SPECS = [
    _fn("get_weather", "Current weather of a city.", city={"type": "string"},
        unit={"type": "string", "enum": ["celsius", "fahrenheit"]}),
    _fn("get_time", "Local time in a city.", city={"type": "string"}),
    _fn("search", "Search the web.", query={"type": "string"}),
    _fn("convert_currency", "Convert an amount.", amount={"type": "number"},
        to={"type": "string"}),
]  # fmt: skip
TOOLS = [{"type": "function", "function": spec} for spec in SPECS]


def _call(i: int, name: str, **args: object) -> dict:
    return {"id": f"call_{i}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)}}  # fmt: skip


def openai_rows() -> list[dict]:
    rows: list[dict] = []
    for n, city in enumerate(CITIES[:8]):  # single calls
        rows.append({"tools": TOOLS, "messages": [
            {"role": "user", "content": f"Use get_weather to tell me the weather in {city}."},
            {"role": "assistant", "content": None,
             "tool_calls": [_call(1, "get_weather", city=city, unit="celsius")]},
            {"role": "tool", "tool_call_id": "call_1", "content": f"{10 + n} degrees, clear"},
            {"role": "assistant", "content": f"It is {10 + n} degrees and clear in {city}."},
        ]})  # fmt: skip
    for city in CITIES[:5]:  # parallel calls, results in another order than the calls
        rows.append({"tools": TOOLS, "messages": [
            {"role": "system", "content": "Answer with tools where you can."},
            {"role": "user", "content": f"Call get_time and get_weather for {city}."},
            {"role": "assistant", "content": "",
             "tool_calls": [_call(1, "get_time", city=city), _call(2, "get_weather", city=city)]},
            {"role": "tool", "tool_call_id": "call_2", "content": "light rain"},
            {"role": "tool", "tool_call_id": "call_1", "content": "09:30"},
            {"role": "assistant", "content": f"In {city} it is 09:30 with light rain."},
        ]})  # fmt: skip
    for city in CITIES[5:9]:  # multi-step: a result names the next function
        rows.append({"tools": TOOLS, "messages": [
            {"role": "user", "content": f"Please search for the best museum in {city}."},
            {"role": "assistant", "content": "", "tool_calls": [_call(1, "search", query=city)]},
            {"role": "tool", "tool_call_id": "call_1",
             "content": "The Modern Museum. Opening hours depend on it: call get_time."},
            {"role": "assistant", "content": "", "tool_calls": [_call(2, "get_time", city=city)]},
            {"role": "tool", "tool_call_id": "call_2", "content": "14:10"},
            {"role": "assistant", "content": "The Modern Museum; it is 14:10 there now."},
            {"role": "user", "content": "Thanks, that is all."},
            {"role": "assistant", "content": "You are welcome."},
        ]})  # fmt: skip
    rows.append({"tools": TOOLS, "messages": [  # mismatch at turn 0: asked search, called weather
        {"role": "user", "content": "Run a search for rain gear shops in Bergen."},
        {"role": "assistant", "content": "",
         "tool_calls": [_call(1, "get_weather", city="Bergen")]},
        {"role": "tool", "tool_call_id": "call_1", "content": "rain"},
        {"role": "assistant", "content": "It rains in Bergen."},
    ]})  # fmt: skip
    rows.append({"tools": TOOLS, "messages": [  # mismatch at turn 1: told get_time, converted
        {"role": "user", "content": "What does a coffee cost in Tokyo? Use search."},
        {"role": "assistant", "content": "", "tool_calls": [_call(1, "search", query="coffee")]},
        {"role": "tool", "tool_call_id": "call_1",
         "content": "500 yen; for the hour use get_time."},
        {"role": "assistant", "content": "",
         "tool_calls": [_call(2, "convert_currency", amount=500, to="EUR")]},
        {"role": "tool", "tool_call_id": "call_2", "content": "3.10 EUR"},
        {"role": "assistant", "content": "About 3.10 euros."},
    ]})  # fmt: skip
    rows.append({"tools": TOOLS, "messages": [  # tools given, none needed
        {"role": "user", "content": "Say hello in French."},
        {"role": "assistant", "content": "Bonjour."},
    ]})  # fmt: skip
    rows.append({"tools": TOOLS[:2], "messages": [  # the same question, other tools: a sample
        {"role": "user", "content": "Say hello in French."},
        {"role": "assistant", "content": "Bonjour."},
    ]})  # fmt: skip
    rows.append({"tools": TOOLS, "messages": [  # invalid: calls a function not in tools
        {"role": "user", "content": "Use get_stock for ACME."},
        {"role": "assistant", "content": "", "tool_calls": [_call(1, "get_stock", sym="ACME")]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12"},
    ]})  # fmt: skip
    rows.append({"tools": TOOLS, "messages": [  # invalid: arguments that are not JSON
        {"role": "user", "content": "Use get_time for Rome."},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c", "type": "function",
             "function": {"name": "get_time", "arguments": "{city: Rome"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "10:00"},
    ]})  # fmt: skip
    return rows


def sharegpt_rows() -> list[dict]:
    tools = json.dumps(SPECS)  # LLaMA-Factory's shape: the bare specs, as a JSON string
    rows: list[dict] = []
    for n, city in enumerate(CITIES):  # single calls
        call = {"name": "get_weather", "arguments": {"city": city}}
        rows.append({"tools": tools, "conversations": [
            {"from": "human", "value": f"get_weather for {city}, please."},
            {"from": "function_call", "value": json.dumps(call)},
            {"from": "observation", "value": json.dumps({"temp": 20 + n})},
            {"from": "gpt", "value": f"{20 + n} degrees in {city}."},
        ]})  # fmt: skip
    for city in CITIES[:4]:  # parallel calls as a list
        calls = [{"name": "get_weather", "arguments": {"city": city}},
                 {"name": "get_time", "arguments": {"city": city}}]  # fmt: skip
        rows.append({"tools": tools, "system": "You are a travel helper.", "conversations": [
            {"from": "human", "value": f"In {city}: get_weather, then get_time."},
            {"from": "function_call", "value": json.dumps(calls)},
            {"from": "observation", "value": "sunny"},
            {"from": "observation", "value": "18:45"},
            {"from": "gpt", "value": f"Sunny, and 18:45 in {city}."},
        ]})  # fmt: skip
    rows.append({"tools": tools, "conversations": [  # mismatch at turn 0
        {"from": "human", "value": "convert_currency 20 USD to EUR"},
        {"from": "function_call", "value": json.dumps({"name": "search", "arguments": {}})},
        {"from": "observation", "value": "18.40"},
        {"from": "gpt", "value": "18.40 euros."},
    ]})  # fmt: skip
    rows.append({"tools": "[{\"name\": ", "conversations": [  # invalid: broken tools JSON
        {"from": "human", "value": "get_time for Oslo"},
        {"from": "gpt", "value": "noon"},
    ]})  # fmt: skip
    return rows


def main() -> None:
    with (DATA / "tool_calls_openai.jsonl").open("w", encoding="utf-8") as fh:
        for row in openai_rows():
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    text = json.dumps(sharegpt_rows(), ensure_ascii=False, indent=1)
    (DATA / "tool_calls_sharegpt.json").write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
