"""Structured output and tool calls through zinfer's HTTP front, with the
official `openai` package; every JSON answer is checked by `jsonschema`.

Usage: openai_tools.py BASE_URL MODEL

Exits non-zero with the reason on the first failure; prints one line per
check and "openai tools checks passed" at the end.
"""

import json
import sys

import jsonschema
import openai

base_url, model = sys.argv[1:3]
client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=300)


def ask(text):
    return [{"role": "user", "content": text}]


SCHEMAS = {
    "nested_object": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "address": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 30},
                               "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["city", "zip"],
                "additionalProperties": False,
            },
        },
        "required": ["name", "address"],
        "additionalProperties": False,
    },
    "bounded_array": {
        "type": "object",
        "properties": {"colors": {"type": "array", "items": {"type": "string", "maxLength": 12},
                                  "minItems": 2, "maxItems": 4}},
        "required": ["colors"],
        "additionalProperties": False,
    },
    "enum": {
        "type": "object",
        "properties": {"sentiment": {"enum": ["positive", "negative", "neutral"]}},
        "required": ["sentiment"],
        "additionalProperties": False,
    },
    "bounded_numbers": {
        "type": "object",
        "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 120},
                       "score": {"type": "number", "minimum": 0, "maximum": 1}},
        "required": ["age", "score"],
        "additionalProperties": False,
    },
    "optional_fields": {
        "type": "object",
        "properties": {"title": {"type": "string", "maxLength": 40},
                       "subtitle": {"type": "string", "maxLength": 40}},
        "required": ["title"],
        "additionalProperties": False,
    },
    "defs_and_ref": {
        "type": "object",
        "$defs": {"point": {"type": "object",
                            "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                            "required": ["x", "y"], "additionalProperties": False}},
        "properties": {"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}},
        "required": ["start", "end"],
        "additionalProperties": False,
    },
    "pattern": {
        "type": "object",
        "properties": {"date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}},
        "required": ["date"],
        "additionalProperties": False,
    },
    "any_of": {
        "type": "object",
        "properties": {"value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 100000},
                                           {"type": "string", "maxLength": 20}]}},
        "required": ["value"],
        "additionalProperties": False,
    },
    "nullable": {
        "type": "object",
        "properties": {"nickname": {"type": ["string", "null"], "maxLength": 20}},
        "required": ["nickname"],
        "additionalProperties": False,
    },
}

for name, schema in SCHEMAS.items():
    response = client.chat.completions.create(
        model=model, messages=ask(f"Answer in JSON ({name.replace('_', ' ')}): describe Paris."),
        max_tokens=200, temperature=0,
        response_format={"type": "json_schema",
                         "json_schema": {"name": name, "strict": True, "schema": schema}})
    choice = response.choices[0]
    assert choice.finish_reason == "stop", (name, choice)
    value = json.loads(choice.message.content)
    jsonschema.validate(value, schema)
    print(f"json_schema {name}: {choice.message.content}")

response = client.chat.completions.create(
    model=model, messages=ask("Give a JSON object about Paris."), max_tokens=100, temperature=0,
    response_format={"type": "json_object"})
if response.choices[0].finish_reason == "stop":
    assert isinstance(json.loads(response.choices[0].message.content), dict), response
else:
    assert response.choices[0].message.content.startswith("{"), response
print(f"json_object: {response.choices[0].message.content}")

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 30},
                   "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"timezone": {"type": "string", "maxLength": 30}},
    "required": ["timezone"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "Current time in a timezone",
                                      "parameters": TIME}},
]
SCHEMA_OF = {"get_weather": WEATHER, "get_time": TIME}
question = ask("What is the weather in Paris?")


def check_calls(calls, allowed):
    assert calls, "no tool calls"
    for call in calls:
        assert call.type == "function", call
        assert call.id, call
        assert call.function.name in allowed, call
        jsonschema.validate(json.loads(call.function.arguments), SCHEMA_OF[call.function.name])


required = client.chat.completions.create(
    model=model, messages=question, tools=TOOLS, tool_choice="required", max_tokens=200, temperature=0)
choice = required.choices[0]
assert choice.finish_reason == "tool_calls", choice
assert not (choice.message.content or "").strip(), choice
check_calls(choice.message.tool_calls, SCHEMA_OF)
print(f"tool_choice required: {[(c.function.name, c.function.arguments) for c in choice.message.tool_calls]}")

named = client.chat.completions.create(
    model=model, messages=question, tools=TOOLS, max_tokens=200, temperature=0,
    tool_choice={"type": "function", "function": {"name": "get_time"}}, parallel_tool_calls=False)
choice = named.choices[0]
assert choice.finish_reason == "tool_calls", choice
assert len(choice.message.tool_calls) == 1, choice
check_calls(choice.message.tool_calls, ["get_time"])
print(f"tool_choice named: {choice.message.tool_calls[0].function.arguments}")

# The same request streamed: the deltas reassemble into the same calls.
stream = client.chat.completions.create(
    model=model, messages=question, tools=TOOLS, tool_choice="required", max_tokens=200,
    temperature=0, stream=True)
calls, finish = {}, None
for chunk in stream:
    if not chunk.choices:
        continue
    delta = chunk.choices[0].delta
    for part in delta.tool_calls or []:
        call = calls.setdefault(part.index, {"id": None, "name": "", "arguments": ""})
        call["id"] = part.id or call["id"]
        if part.function is not None:
            call["name"] += part.function.name or ""
            call["arguments"] += part.function.arguments or ""
    finish = chunk.choices[0].finish_reason or finish
assert finish == "tool_calls", finish
streamed = [(calls[i]["name"], json.loads(calls[i]["arguments"])) for i in sorted(calls)]
whole = [(c.function.name, json.loads(c.function.arguments)) for c in required.choices[0].message.tool_calls]
assert streamed == whole, (streamed, whole)
assert all(calls[i]["id"] for i in calls), calls
print(f"streamed tool calls reassemble: {streamed}")

# A round trip: the call, its result, and an answer in words.
call = required.choices[0].message.tool_calls[0]
history = question + [
    {"role": "assistant", "content": None,
     "tool_calls": [{"id": call.id, "type": "function",
                     "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
    {"role": "tool", "tool_call_id": call.id, "content": "21 degrees celsius, clear sky"},
]
final = client.chat.completions.create(
    model=model, messages=history, tools=TOOLS, tool_choice="none", max_tokens=40, temperature=0)
choice = final.choices[0]
assert choice.finish_reason in ("stop", "length"), choice
assert choice.message.tool_calls is None, choice
assert choice.message.content and choice.message.content.strip(), choice
print(f"tool round trip answer: {choice.message.content!r}")

try:
    client.chat.completions.create(
        model=model, messages=question, tools=TOOLS, max_tokens=5,
        tool_choice={"type": "function", "function": {"name": "nope"}})
    raise AssertionError("a tool_choice naming no tool was accepted")
except openai.BadRequestError as error:
    assert "nope" in str(error), error
print("bad tool_choice: 400")
print("openai tools checks passed")
