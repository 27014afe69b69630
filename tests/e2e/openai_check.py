"""Drives zinfer's HTTP front with the official `openai` package.

Usage: openai_check.py BASE_URL MODEL API_KEY

Checks chat (streamed and not), completions, log probabilities on both
(streamed and not), a bad request (400) and an unknown model (404); exits
non-zero with the reason on the first failure, and prints one summary line
per check.
"""

import math
import sys

import openai

base_url, model, api_key = sys.argv[1:4]
client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120)
question = [{"role": "user", "content": "What is the capital of France?"}]

# Warm the worker's prefix cache with the question first, so the two
# requests compared below compute the same uncached rows. A cold prefill
# (many rows through one matrix product) and a cached one (a single row)
# round differently in the last bits, and this question's first token is a
# near-tie ("The" 25.33 vs "L" 25.24 in logits): it can flip between the two.
client.chat.completions.create(model=model, messages=question, max_tokens=1, temperature=0)

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

# Log probabilities, chat: one entry per completion token whose texts spell
# the answer; greedy picks the most likely token, so each token is first
# in its own top list with the same logprob; probabilities are at most 1.
def check_chat_entries(entries, top, answer, tokens):
    assert len(entries) == tokens, (len(entries), tokens)
    assert "".join(e.token for e in entries) == answer, ([e.token for e in entries], answer)
    for e in entries:
        assert e.logprob <= 0.0 and math.isfinite(e.logprob), e
        assert e.bytes == list(e.token.encode("utf-8")), e
        assert len(e.top_logprobs) == top, e
        best = e.top_logprobs[0]
        assert best.token == e.token and abs(best.logprob - e.logprob) < 1e-6, e
        listed = [t.logprob for t in e.top_logprobs]
        assert listed == sorted(listed, reverse=True), listed
        assert sum(math.exp(lp) for lp in listed) <= 1.0 + 1e-4, listed


chat_lp = client.chat.completions.create(
    model=model, messages=question, max_tokens=12, temperature=0, logprobs=True, top_logprobs=3
)
answer = chat_lp.choices[0].message.content
assert answer == text, (answer, text)
entries = chat_lp.choices[0].logprobs.content
# An end-of-sequence token counts in usage but is not part of the output.
shown = chat_lp.usage.completion_tokens - (chat_lp.choices[0].finish_reason == "stop")
check_chat_entries(entries, 3, answer, shown)
print(f"chat logprobs: {[(e.token, round(e.logprob, 3)) for e in entries[:4]]}")

stream = client.chat.completions.create(
    model=model,
    messages=question,
    max_tokens=12,
    temperature=0,
    logprobs=True,
    top_logprobs=3,
    stream=True,
)
streamed_entries, pieces = [], []
for chunk in stream:
    for choice in chunk.choices:
        pieces.append(choice.delta.content or "")
        if choice.logprobs is not None:
            streamed_entries.extend(choice.logprobs.content)
assert "".join(pieces) == answer, pieces
check_chat_entries(streamed_entries, 3, answer, len(entries))
for a, b in zip(entries, streamed_entries):
    assert a.token == b.token and abs(a.logprob - b.logprob) < 1e-3, (a, b)
print("chat stream logprobs: same tokens and values")

plain = client.chat.completions.create(model=model, messages=question, max_tokens=4, temperature=0)
assert plain.choices[0].logprobs is None, plain.choices[0]
only = client.chat.completions.create(
    model=model, messages=question, max_tokens=4, temperature=0, logprobs=True
)
assert all(e.top_logprobs == [] for e in only.choices[0].logprobs.content), only.choices[0]

# Log probabilities, completions: parallel lists, chosen token listed in
# its top map, offsets running over the text.
def check_completion_logprobs(lp, top, answer, tokens):
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == tokens, lp
    assert "".join(lp.tokens) == answer, (lp.tokens, answer)
    offset = 0
    for token, logprob, alternatives, at in zip(
        lp.tokens, lp.token_logprobs, lp.top_logprobs, lp.text_offset
    ):
        assert at == offset, (at, offset)
        offset += len(token)
        assert logprob <= 0.0, logprob
        assert token in alternatives and abs(alternatives[token] - logprob) < 1e-6, alternatives
        # Up to `top` plus the chosen one; two ids with one text count once.
        assert 1 <= len(alternatives) <= top + 1, alternatives
        assert max(alternatives.values()) == logprob, (token, alternatives)


completion_lp = client.completions.create(
    model=model, prompt="The three primary colors are", max_tokens=8, temperature=0, logprobs=2
)
assert completion_lp.choices[0].text == completion.choices[0].text, completion_lp
lp = completion_lp.choices[0].logprobs
check_completion_logprobs(lp, 2, completion_lp.choices[0].text, 8)
print(f"completion logprobs: {list(zip(lp.tokens, lp.token_logprobs))[:3]}")

tokens, logprobs, offsets = [], [], []
for chunk in client.completions.create(
    model=model,
    prompt="The three primary colors are",
    max_tokens=8,
    temperature=0,
    logprobs=2,
    stream=True,
):
    for choice in chunk.choices:
        if choice.logprobs is not None:
            tokens.extend(choice.logprobs.tokens)
            logprobs.extend(choice.logprobs.token_logprobs)
            offsets.extend(choice.logprobs.text_offset)
assert tokens == lp.tokens, (tokens, lp.tokens)
assert offsets == lp.text_offset, (offsets, lp.text_offset)
assert all(abs(a - b) < 1e-3 for a, b in zip(logprobs, lp.token_logprobs)), logprobs
print("completion stream logprobs: same tokens, values and offsets")

try:
    client.chat.completions.create(
        model=model, messages=question, logprobs=True, top_logprobs=21, max_tokens=4
    )
    sys.exit("top_logprobs=21 was accepted")
except openai.BadRequestError as error:
    assert error.status_code == 400
    assert error.body["param"] == "top_logprobs", error.body
    print(f"top_logprobs over 20: 400 {error.body['message']}")

try:
    client.completions.create(model=model, prompt="Hi", best_of=2)
    sys.exit("best_of=2 was accepted")
except openai.BadRequestError as error:
    assert error.status_code == 400
    assert error.body["param"] == "best_of", error.body
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
