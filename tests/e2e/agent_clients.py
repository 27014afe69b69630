"""Drives zinfer's HTTP front with `langchain-openai`, `instructor` and
`litellm`, unchanged, as agent frameworks and applications use them.

Usage: agent_clients.py HTTP_BASE MODEL

HTTP_BASE is the front's root (http://HOST:PORT). Exits non-zero with the
reason on the first failure; prints one line per check, and a last line
saying they all passed.
"""

import json
import os
import sys

# litellm reads its model price list from the network at import unless told
# to use the copy it ships.
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"

import instructor  # noqa: E402
import litellm  # noqa: E402
import openai  # noqa: E402
from langchain_core.messages import AIMessageChunk  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402
from pydantic import BaseModel, Field  # noqa: E402

litellm.suppress_debug_info = True  # it prints a provider list for a model it has no price for
root, model = sys.argv[1:3]
base = f"{root}/v1"
question = "What is the capital of France? Answer in one short sentence."


class City(BaseModel):
    """A city and the country it is in."""

    name: str = Field(max_length=20)
    country: str = Field(max_length=20)


# langchain-openai: invoke and stream (the same greedy answer), a forced
# tool, structured output.
chat = ChatOpenAI(model=model, base_url=base, api_key="unused", temperature=0, max_tokens=16,
                  max_retries=0, timeout=120, stream_usage=True)
chat.invoke(question, max_tokens=1)  # warm the prefix cache: a cold prefill rounds differently
whole = chat.invoke(question)
assert isinstance(whole.content, str) and whole.content.strip(), whole
assert whole.usage_metadata and whole.usage_metadata["output_tokens"] > 0, whole
chunks = list(chat.stream(question))
streamed = "".join(chunk.content for chunk in chunks)
assert streamed == whole.content, (streamed, whole.content)
merged = chunks[0]
for chunk in chunks[1:]:
    merged = merged + chunk
assert isinstance(merged, AIMessageChunk) and merged.usage_metadata, merged
assert merged.usage_metadata["output_tokens"] == whole.usage_metadata["output_tokens"], merged


@tool
def get_weather(city: str) -> str:
    """Current weather in a city."""
    return "Sunny"


forced = chat.bind_tools([get_weather], tool_choice="get_weather")
called = forced.invoke("What is the weather in Paris?", max_tokens=60)
assert len(called.tool_calls) == 1, called
assert called.tool_calls[0]["name"] == "get_weather", called
assert set(called.tool_calls[0]["args"]) == {"city"}, called.tool_calls
structured = ChatOpenAI(model=model, base_url=base, api_key="unused", temperature=0,
                        max_tokens=60, max_retries=0, timeout=120)
for method in ("json_schema", "function_calling"):
    city = structured.with_structured_output(City, method=method).invoke(
        "Name a city in France.")
    assert isinstance(city, City) and city.name and city.country, (method, city)
print(f"langchain-openai: {whole.content!r}, streamed the same; "
      f"call {called.tool_calls[0]['args']}; structured {city}")

# instructor: tools mode (its default) and JSON-schema mode, each one
# request that ends with the schema's keys only.
# A pydantic schema has no `additionalProperties: false`; zinfer holds the
# arguments to the schema's keys anyway, so the small model cannot run on.
client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=120)
italy = [{"role": "system", "content": "Reply with JSON."},
         {"role": "user", "content": "Name a city in Italy."}]
for mode in (instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA):
    patched = instructor.from_openai(client, mode=mode)
    city, completion = patched.chat.completions.create_with_completion(
        model=model, response_model=City, temperature=0, max_tokens=80, max_retries=0,
        messages=italy)
    assert isinstance(city, City), city
    choice = completion.choices[0]
    if mode == instructor.Mode.TOOLS:
        assert choice.finish_reason == "tool_calls", completion
        assert len(choice.message.tool_calls) == 1, completion
        raw = choice.message.tool_calls[0].function.arguments
    else:
        assert choice.finish_reason == "stop", completion
        raw = choice.message.content
    assert set(json.loads(raw)) == {"name", "country"}, raw
    print(f"instructor {mode.value}: {city}")

# litellm: a completion whole and streamed (the same greedy answer), an
# embedding.
common = {"model": f"openai/{model}", "api_base": base, "api_key": "unused", "timeout": 120}
messages = [{"role": "user", "content": question}]
whole = litellm.completion(messages=messages, temperature=0, max_tokens=16, **common)
text = whole.choices[0].message.content
assert text and text.strip(), whole
assert whole.usage.completion_tokens > 0, whole.usage
chunks = list(litellm.completion(messages=messages, temperature=0, max_tokens=16, stream=True,
                                stream_options={"include_usage": True}, **common))
streamed = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
assert streamed == text, (streamed, text)
built = litellm.stream_chunk_builder(chunks)
assert built.usage.completion_tokens == whole.usage.completion_tokens, (built.usage, whole.usage)
vectors = litellm.embedding(input=["Paris", "Rome"], **common)
assert len(vectors.data) == 2, vectors
assert len(vectors.data[0]["embedding"]) > 16, vectors.data[0]
print(f"litellm: {text!r}, streamed the same; embeddings of {len(vectors.data[0]['embedding'])}")

print("agent client checks passed")
