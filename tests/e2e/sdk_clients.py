"""Drives zinfer's HTTP front with the official `anthropic` and `openai`
packages, unchanged, as agent frameworks and evaluation harnesses do.

Usage: sdk_clients.py HTTP_BASE MODEL

HTTP_BASE is the front's root (http://HOST:PORT). Exits non-zero with the
reason on the first failure; prints one line per check, and a last line
saying they all passed.
"""

import json
import sys

import anthropic
import openai

root, model = sys.argv[1:3]
claude = anthropic.Anthropic(base_url=root, api_key="unused", max_retries=0, timeout=120)
gpt = openai.OpenAI(base_url=f"{root}/v1", api_key="unused", max_retries=0, timeout=120)
question = [{"role": "user", "content": "What is the capital of France?"}]
system = "Answer in one short sentence."

# Warm the prefix cache with the prompt, so the whole and streamed answers
# below compute the same uncached rows (a cold prefill rounds differently).
claude.messages.create(model=model, max_tokens=1, temperature=0, system=system, messages=question)

# Anthropic: a message, whole and streamed, the same greedy answer.
whole = claude.messages.create(model=model, max_tokens=16, temperature=0, system=system,
                               messages=question)
assert whole.type == "message" and whole.role == "assistant", whole
assert whole.content[0].type == "text" and whole.content[0].text.strip(), whole
assert whole.stop_reason in ("end_turn", "max_tokens"), whole
assert 0 < whole.usage.output_tokens <= 16, whole.usage
with claude.messages.stream(model=model, max_tokens=16, temperature=0, system=system,
                            messages=question) as stream:
    streamed = "".join(stream.text_stream)
    final = stream.get_final_message()
assert streamed == whole.content[0].text, (streamed, whole.content[0].text)
assert final.stop_reason == whole.stop_reason, final
assert final.usage.output_tokens == whole.usage.output_tokens, final.usage
print(f"anthropic messages: {streamed!r}, streamed the same, {final.stop_reason}")

counted = claude.messages.count_tokens(model=model, system=system, messages=question)
prompt = whole.usage.input_tokens + (whole.usage.cache_read_input_tokens or 0)
assert counted.input_tokens == prompt, (counted, whole.usage)
print(f"anthropic count_tokens: {counted.input_tokens}")

# Tools: a forced call, whole and streamed; its input follows the schema.
tools = [{"name": "get_weather", "description": "Current weather in a city",
          "input_schema": {"type": "object",
                           "properties": {"city": {"type": "string", "maxLength": 20}},
                           "required": ["city"]}}]
weather = [{"role": "user", "content": "What is the weather in Paris?"}]
forced = {"type": "tool", "name": "get_weather"}
called = claude.messages.create(model=model, max_tokens=60, temperature=0, tools=tools,
                                tool_choice=forced, messages=weather)
assert called.stop_reason == "tool_use", called
uses = [block for block in called.content if block.type == "tool_use"]
assert len(uses) == 1 and uses[0].name == "get_weather", called
assert set(uses[0].input) == {"city"} and isinstance(uses[0].input["city"], str), uses[0]
with claude.messages.stream(model=model, max_tokens=60, temperature=0, tools=tools,
                            tool_choice=forced, messages=weather) as stream:
    final = stream.get_final_message()
streamed_uses = [block for block in final.content if block.type == "tool_use"]
assert [u.input for u in streamed_uses] == [uses[0].input], final
# The call and its result go back; the model answers in text.
answer = claude.messages.create(model=model, max_tokens=20, temperature=0, tools=tools,
                                messages=weather + [
                                    {"role": "assistant", "content": called.content},
                                    {"role": "user", "content": [
                                        {"type": "tool_result", "tool_use_id": uses[0].id,
                                         "content": "Sunny, 21 C"}]}])
assert answer.content and answer.stop_reason in ("end_turn", "max_tokens", "tool_use"), answer
print(f"anthropic tools: {uses[0].input}, streamed the same; after the result: {answer.stop_reason}")

# Refusals the SDK raises as typed errors.
try:
    claude.messages.create(model=model, max_tokens=5, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}])
    raise AssertionError("an image was accepted")
except anthropic.BadRequestError as error:
    assert "image" in error.message, error.message
try:
    claude.messages.create(model="no-such-model", max_tokens=5, messages=question)
    raise AssertionError("an unknown model was accepted")
except anthropic.NotFoundError as error:
    assert error.body["error"]["type"] == "not_found_error", error.body
print("anthropic errors: image 400, unknown model 404")

# OpenAI: the fields agent frameworks send on every call, models.retrieve,
# the request id header, a list of prompts.
raw = gpt.chat.completions.with_raw_response.create(
    model=model, messages=question, max_tokens=4, temperature=0, store=False,
    service_tier="auto", prompt_cache_key="k", safety_identifier="u", modalities=["text"],
    verbosity="low")
assert raw.headers.get("x-request-id"), raw.headers
assert raw.parse().choices[0].message.content, raw.parse()
listed = gpt.models.retrieve(model)
assert listed.id == model, listed
try:
    gpt.models.retrieve("no-such-model")
    raise AssertionError("an unknown model was retrieved")
except openai.NotFoundError:
    pass
batch = gpt.completions.create(model=model, prompt=["One, two,", "Red, green,"], max_tokens=3,
                               temperature=0)
assert [c.index for c in batch.choices] == [0, 1], batch
alone = gpt.completions.create(model=model, prompt="Red, green,", max_tokens=3, temperature=0)
assert batch.choices[1].text == alone.choices[0].text, (batch, alone)
print(f"openai: fields accepted, x-request-id {raw.headers['x-request-id']}, models.retrieve, "
      f"two prompts {[c.text for c in batch.choices]}")

# OpenAI Responses: whole and streamed (the same greedy answer), a forced
# function call and its output sent back, a JSON schema.
resp = gpt.responses.create(model=model, input=question[0]["content"], instructions=system,
                            max_output_tokens=16, temperature=0)
assert resp.status in ("completed", "incomplete") and resp.output_text.strip(), resp
with gpt.responses.stream(model=model, input=question[0]["content"], instructions=system,
                          max_output_tokens=16, temperature=0) as stream:
    deltas = "".join(event.delta for event in stream if event.type == "response.output_text.delta")
    final = stream.get_final_response()
assert deltas == final.output_text == resp.output_text, (deltas, final.output_text, resp.output_text)
assert final.usage.output_tokens == resp.usage.output_tokens, final.usage
function = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
            "parameters": {"type": "object",
                           "properties": {"city": {"type": "string", "maxLength": 20}},
                           "required": ["city"]}}
called = gpt.responses.create(model=model, input="What is the weather in Paris?", tools=[function],
                              tool_choice={"type": "function", "name": "get_weather"},
                              max_output_tokens=60, temperature=0)
calls = [item for item in called.output if item.type == "function_call"]
assert len(calls) == 1 and calls[0].name == "get_weather", called
arguments = json.loads(calls[0].arguments)
assert set(arguments) == {"city"}, arguments
after = gpt.responses.create(model=model, tools=[function], max_output_tokens=20, temperature=0,
                             input=[{"role": "user", "content": "What is the weather in Paris?"},
                                    calls[0],
                                    {"type": "function_call_output", "call_id": calls[0].call_id,
                                     "output": "Sunny, 21 C"}])
assert after.output, after
shaped = gpt.responses.create(
    model=model, input="Name a city and its country.", max_output_tokens=60, temperature=0,
    text={"format": {"type": "json_schema", "name": "place", "schema": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                         "country": {"type": "string", "maxLength": 20}},
        "required": ["city", "country"]}}})
assert set(json.loads(shaped.output_text)) == {"city", "country"}, shaped.output_text
try:
    gpt.responses.create(model=model, input="x", tools=[{"type": "web_search_preview"}])
    raise AssertionError("a built-in tool was accepted")
except openai.BadRequestError as error:
    assert "web_search_preview" in str(error), error
# Stored responses: continued by id (the worker's prefix cache holds the
# first turn), fetched, deleted.
first = gpt.responses.create(model=model, input="Name a color.", max_output_tokens=8, temperature=0)
second = gpt.responses.create(model=model, previous_response_id=first.id, input="Another one.",
                              max_output_tokens=8, temperature=0)
assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens, \
    (first.usage, second.usage)
assert second.usage.input_tokens_details.cached_tokens > 0, second.usage
assert gpt.responses.retrieve(first.id).output_text == first.output_text
gpt.responses.delete(first.id)
try:
    gpt.responses.retrieve(first.id)
    raise AssertionError("a deleted response was retrieved")
except openai.NotFoundError:
    pass
print(f"openai responses: {resp.output_text!r}, streamed the same; call {arguments}; "
      f"json {shaped.output_text}")

print("sdk checks passed")
