"""Drives zinfer's HTTP front with the official `openai` package.

Usage: openai_check.py BASE_URL MODEL API_KEY

Checks chat (streamed and not), completions, a bad request (400) and an
unknown model (404); exits non-zero with the reason on the first failure,
and prints one summary line per check.
"""

import sys

import openai

base_url, model, api_key = sys.argv[1:4]
client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120)
question = [{"role": "user", "content": "What is the capital of France?"}]

chat = client.chat.completions.create(model=model, messages=question, max_tokens=12, temperature=0)
text = chat.choices[0].message.content
assert text and text.strip(), chat
assert chat.choices[0].finish_reason in ("stop", "length"), chat
assert chat.usage.prompt_tokens > 5 and 0 < chat.usage.completion_tokens <= 12, chat.usage
assert chat.usage.prompt_tokens_details.cached_tokens >= 0, chat.usage
print(f"chat: {text!r} usage={chat.usage.prompt_tokens}/{chat.usage.completion_tokens}")

stream = client.chat.completions.create(
    model=model,
    messages=question,
    max_tokens=12,
    temperature=0,
    stream=True,
    stream_options={"include_usage": True},
)
pieces, finish, usage = [], None, None
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    for choice in chunk.choices:
        pieces.append(choice.delta.content or "")
        finish = choice.finish_reason or finish
streamed = "".join(pieces)
assert streamed == text, (streamed, text)
assert finish == chat.choices[0].finish_reason, finish
assert usage is not None and usage.completion_tokens == chat.usage.completion_tokens, usage
# The same prompt again: its prefix comes from the worker's radix cache.
assert usage.prompt_tokens_details.cached_tokens > 0, usage
print(f"chat stream: {streamed!r} cached={usage.prompt_tokens_details.cached_tokens}")

completion = client.completions.create(
    model=model, prompt="The three primary colors are", max_tokens=8, temperature=0
)
assert completion.choices[0].text.strip(), completion
assert completion.usage.completion_tokens == 8, completion.usage
assert completion.choices[0].finish_reason == "length", completion
print(f"completion: {completion.choices[0].text!r}")

pieces = []
for chunk in client.completions.create(
    model=model, prompt="The three primary colors are", max_tokens=8, temperature=0, stream=True
):
    pieces.extend(choice.text for choice in chunk.choices)
assert "".join(pieces) == completion.choices[0].text, pieces
print("completion stream: same text")

try:
    client.chat.completions.create(model=model, messages=question, n=2)
    sys.exit("n=2 was accepted")
except openai.BadRequestError as error:
    assert error.status_code == 400
    assert error.body["param"] == "n", error.body
    print(f"bad request: 400 {error.body['message']}")

try:
    client.chat.completions.create(model="no-such-model", messages=question, max_tokens=4)
    sys.exit("an unknown model was accepted")
except openai.NotFoundError as error:
    assert error.status_code == 404
    assert error.body["code"] == "model_not_found", error.body
    print(f"unknown model: 404 {error.body['message']}")

models = [m.id for m in client.models.list()]
assert model in models, models
print(f"models: {models}")
print("openai checks passed")
