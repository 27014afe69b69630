"""OpenAI sampling parameters through zinfer's HTTP front, with the
official `openai` package: `logit_bias`, `presence_penalty` and
`frequency_penalty`, `priority` and `metadata`.

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
