"""OpenAI sampling parameters through zinfer's HTTP front, with the
official `openai` package: `logit_bias`, `presence_penalty` and
`frequency_penalty`, `n` with a seed, `echo` with prompt logprobs,
embeddings, `priority` and `metadata`.

Usage: openai_params.py BASE_URL MODEL

Exits non-zero with the reason on the first failure; prints one line per
check and "openai params checks passed" at the end.
"""

import json
import sys
import urllib.request

import openai

base_url, model = sys.argv[1:3]
client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=300)
root = base_url.removesuffix("/v1")
question = [{"role": "user", "content": "Name a fruit."}]


def token_id(text):
    request = urllib.request.Request(
        f"{root}/tokenize", data=json.dumps({"content": text}).encode(),
        headers={"content-type": "application/json"})
    with urllib.request.urlopen(request) as reply:
        tokens = json.load(reply)["tokens"]
    assert len(tokens) == 1, (text, tokens)
    return tokens[0]


def first_token(**extra):
    response = client.chat.completions.create(
        model=model, messages=question, max_tokens=1, temperature=0, logprobs=True, **extra)
    return response.choices[0].logprobs.content[0].token


plain = first_token()
banana = token_id("Apple")
assert plain != "Apple", plain
forced = first_token(logit_bias={str(banana): 100})
assert forced == "Apple", forced
print(f"logit_bias +100: first token {plain!r} -> {forced!r}")
plain_id = token_id(plain)
forbidden = first_token(logit_bias={str(plain_id): -100})
assert forbidden != plain, forbidden
print(f"logit_bias -100: first token {plain!r} -> {forbidden!r}")


def repeats(**extra):
    response = client.completions.create(
        model=model, prompt="List the days of the week, again and again:", max_tokens=80,
        temperature=0, logprobs=0, **extra)
    tokens = response.choices[0].logprobs.tokens
    return len(tokens) - len(set(tokens)), response.choices[0].text


plain_repeats, plain_text = repeats()
presence_repeats, presence_text = repeats(presence_penalty=2.0)
frequency_repeats, _ = repeats(frequency_penalty=2.0)
assert presence_repeats < plain_repeats, (presence_repeats, plain_repeats, presence_text)
assert frequency_repeats < plain_repeats, (frequency_repeats, plain_repeats)
print(f"repeated tokens in 80: plain {plain_repeats}, presence_penalty 2 {presence_repeats}, "
      f"frequency_penalty 2 {frequency_repeats}")

def choices(**extra):
    response = client.chat.completions.create(
        model=model, messages=question, n=3, seed=11, temperature=1.0, max_tokens=12, **extra)
    assert [c.index for c in response.choices] == [0, 1, 2], response
    return response


first = choices()
again = choices()
texts = [c.message.content for c in first.choices]
assert texts == [c.message.content for c in again.choices], (texts, again)
assert len(set(texts)) > 1, texts
assert first.usage.completion_tokens == sum(
    len(c.logprobs.content) for c in choices(logprobs=True).choices), first.usage
stream = client.chat.completions.create(
    model=model, messages=question, n=3, seed=11, temperature=1.0, max_tokens=12, stream=True)
streamed, finished = ["", "", ""], [None, None, None]
for chunk in stream:
    for choice in chunk.choices:
        streamed[choice.index] += choice.delta.content or ""
        finished[choice.index] = choice.finish_reason or finished[choice.index]
assert streamed == texts, (streamed, texts)
assert all(finished), finished
print(f"n=3 with a seed repeats, streamed or not: {texts}")

# echo: the prompt's tokens with their logprobs (the first null), which
# agree with the logprobs the same tokens got when they were generated.
prompt = "The capital of France is"
generated = client.completions.create(model=model, prompt=prompt, max_tokens=6, temperature=0,
                                      logprobs=0)
gen_lp = generated.choices[0].logprobs
text = prompt + generated.choices[0].text
scored = client.completions.create(model=model, prompt=text, max_tokens=0, echo=True, logprobs=2)
choice = scored.choices[0]
assert choice.text == text, (choice.text, text)
lp = choice.logprobs
assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None, lp
assert "".join(lp.tokens) == text, lp.tokens
assert len(lp.tokens) == scored.usage.prompt_tokens, (lp.tokens, scored.usage)
tail = len(gen_lp.tokens)
assert lp.tokens[-tail:] == gen_lp.tokens, (lp.tokens, gen_lp.tokens)
for mine, theirs in zip(lp.token_logprobs[-tail:], gen_lp.token_logprobs):
    assert abs(mine - theirs) < 0.05, (lp.token_logprobs, gen_lp.token_logprobs)
assert all(len(top) >= 1 for top in lp.top_logprobs[1:]), lp.top_logprobs
print(f"echo + logprobs: {len(lp.tokens)} prompt tokens; generated tail agrees: "
      f"{[round(x, 3) for x in lp.token_logprobs[-tail:]]} vs "
      f"{[round(x, 3) for x in gen_lp.token_logprobs]}")

# Embeddings: paraphrases closer than unrelated texts; batched equals one
# by one; base64 carries the same floats.
import base64
import math
import struct

texts = ["The cat sat on the mat.", "A cat was sitting on the mat.",
         "Quarterly revenue grew by eight percent."]
batch = client.embeddings.create(model=model, input=texts)
vectors = [d.embedding for d in sorted(batch.data, key=lambda d: d.index)]
assert all(abs(math.sqrt(sum(x * x for x in v)) - 1) < 1e-3 for v in vectors), "L2-normalised"


def cosine(a, b):
    return sum(x * y for x, y in zip(a, b))


close, far = cosine(vectors[0], vectors[1]), cosine(vectors[0], vectors[2])
assert close > far, (close, far)
for text, vector in zip(texts, vectors):
    alone = client.embeddings.create(model=model, input=text).data[0].embedding
    assert max(abs(x - y) for x, y in zip(alone, vector)) < 1e-4, text
raw = client.embeddings.create(model=model, input=texts[0], encoding_format="base64").data[0]
floats = struct.unpack(f"<{len(vectors[0])}f", base64.b64decode(raw.embedding))
assert max(abs(x - y) for x, y in zip(floats, vectors[0])) < 1e-4, "base64 == float"
assert batch.usage.prompt_tokens > 0, batch.usage
print(f"embeddings: {len(vectors[0])} floats; cosine paraphrase {close:.3f} > unrelated {far:.3f}; "
      "batched == one by one")

labelled = client.chat.completions.create(
    model=model, messages=question, max_tokens=4, temperature=0, user="u-1",
    metadata={"team": "search"}, extra_body={"priority": 5})
assert labelled.choices[0].message.content, labelled
print("user, metadata and priority accepted")

try:
    client.chat.completions.create(model=model, messages=question, max_tokens=1,
                                   logit_bias={"99999999": 5})
    raise AssertionError("a bias on a token outside the vocabulary was accepted")
except openai.BadRequestError as error:
    assert "99999999" in str(error), error
print("logit_bias outside the vocabulary: 400")
print("openai params checks passed")
