"""The official openai Python SDK through sluice: only the base URL and key change.

Run by tests/sdk.rs with SLUICE_BASE_URL and SLUICE_KEY; exits non-zero on failure.
"""
import os
import sys

import openai
from openai import OpenAI

client = OpenAI(base_url=os.environ["SLUICE_BASE_URL"] + "/v1",
                api_key=os.environ["SLUICE_KEY"], max_retries=0)

models = [m.id for m in client.models.list()]
assert "chat-a" in models, models

r = client.chat.completions.create(model="chat-a", messages=[{"role": "user", "content": "hi"}])
assert r.choices[0].message.content == "Hello from mock a1.", r
assert r.model == "a1-2025-04-14", r.model
assert r.usage.total_tokens > 0, r.usage
assert r.to_dict()["provider"] == "openai:a1", r.to_dict()

stream = client.chat.completions.create(model="chat-a", stream=True,
                                        stream_options={"include_usage": True},
                                        messages=[{"role": "user", "content": "hi"}])
text, usage, providers = "", None, set()
for chunk in stream:
    providers.add(chunk.to_dict().get("provider"))
    if chunk.usage:
        usage = chunk.usage
    if chunk.choices and chunk.choices[0].delta.content:
        text += chunk.choices[0].delta.content
assert text == "Hello from mock a1.", text
assert usage is not None and usage.total_tokens > 0, usage
assert providers == {"openai:a1"}, providers

# An exact retry with the same Idempotency-Key replays the first answer.
keyed = dict(model="chat-a", messages=[{"role": "user", "content": "once"}],
             extra_headers={"Idempotency-Key": "sdk-retry-1"})
first = client.chat.completions.with_raw_response.create(**keyed)
again = client.chat.completions.with_raw_response.create(**keyed)
assert again.headers.get("idempotent-replayed") == "true", dict(again.headers)
assert again.parse().id == first.parse().id
try:
    client.chat.completions.create(model="chat-a", messages=[{"role": "user", "content": "other"}],
                                   extra_headers={"Idempotency-Key": "sdk-retry-1"})
    sys.exit("expected a 409")
except openai.ConflictError as e:
    assert e.code == "idempotency_conflict", e.code

try:
    client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
    sys.exit("expected a 403")
except openai.PermissionDeniedError as e:
    assert e.code == "model_not_granted", e.code

bad = OpenAI(base_url=os.environ["SLUICE_BASE_URL"] + "/v1", api_key="xpl_" + "0" * 40, max_retries=0)
try:
    bad.models.list()
    sys.exit("expected a 401")
except openai.AuthenticationError as e:
    assert e.code == "invalid_key", e.code

print("python sdk: ok")
