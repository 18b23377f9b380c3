"""The official openai (responses) and anthropic (messages) Python SDKs through sluice,
each against a rung of another maker: only the base URL and key change.

Run by tests/sdk.rs with SLUICE_BASE_URL and SLUICE_KEY; exits non-zero on failure.
"""
import os
import sys

import anthropic
from openai import OpenAI

base, key = os.environ["SLUICE_BASE_URL"], os.environ["SLUICE_KEY"]

# Responses API, served by a Gemini rung.
oa = OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
r = oa.responses.create(model="fmt-gemini", instructions="Be brief.", input="Say hello")
assert r.output_text == "Hello from mock g1.", r
assert r.status == "completed", r.status
assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0, r.usage
assert r.to_dict()["provider"] == "google:g1", r.to_dict()

text, completed = "", None
with oa.responses.stream(model="fmt-gemini", input="Say hello") as stream:
    for event in stream:
        if event.type == "response.output_text.delta":
            text += event.delta
        elif event.type == "response.completed":
            completed = event.response
assert text == "Hello from mock g1.", text
assert completed is not None and completed.usage.total_tokens > 0, completed

# Messages API, served by an OpenAI rung.
an = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
m = an.messages.create(model="fmt-gpt", max_tokens=256, system="Be brief.",
                       messages=[{"role": "user", "content": "Say hello"}])
assert m.content[0].type == "text" and m.content[0].text == "Hello from mock o1.", m
assert m.stop_reason == "end_turn", m.stop_reason
assert m.usage.output_tokens > 0, m.usage

with an.messages.stream(model="fmt-gpt", max_tokens=256,
                        messages=[{"role": "user", "content": "Say hello"}]) as stream:
    streamed = "".join(stream.text_stream)
    final = stream.get_final_message()
assert streamed == "Hello from mock o1.", streamed
assert final.stop_reason == "end_turn", final.stop_reason

# The messages envelope on an error.
try:
    an.messages.create(model="no-such-model", max_tokens=10,
                       messages=[{"role": "user", "content": "hi"}])
    sys.exit("expected a 403")
except anthropic.PermissionDeniedError as e:
    assert e.body["type"] == "error", e.body

print("python formats sdk: ok")
