"""The official openai Python SDK continuing conversations through sluice with
`previous_response_id`, streamed and not, alternating between the instances named
in SLUICE_BASE_URLS (comma-separated: several instances over one database), and the
refusal of an unknown id as the SDK raises it.

Run by tests/sdk.rs; exits non-zero on failure.
"""
import os

import openai
from openai import OpenAI

bases, key = os.environ["SLUICE_BASE_URLS"].split(","), os.environ["SLUICE_KEY"]
clients = [OpenAI(base_url=b + "/v1", api_key=key, max_retries=0) for b in bases]

previous = None
for turn in range(6):
    client = clients[turn % len(clients)]
    if turn % 2 == 0:
        r = client.responses.create(model="fmt-gpt", input=f"turn {turn}",
                                    previous_response_id=previous)
    else:
        with client.responses.stream(model="fmt-gpt", input=f"turn {turn}",
                                     previous_response_id=previous) as stream:
            for _ in stream:
                pass
            r = stream.get_final_response()
    assert r.status == "completed", r
    assert r.output_text == "Hello from mock o1.", r.output_text
    previous = r.id

# A later turn on a Claude rung continues the same conversation.
r = clients[0].responses.create(model="fmt-claude", input="Claude, go on",
                                previous_response_id=previous)
assert r.output_text == "Hello from mock c1.", r.output_text

try:
    clients[-1].responses.create(model="fmt-gpt", input="x", previous_response_id="resp_unknown")
    raise SystemExit("an unknown previous_response_id was served")
except openai.BadRequestError as e:
    assert e.status_code == 400, e
    assert e.code == "previous_response_not_found", e.body
    assert e.param == "previous_response_id", e.body
print("ok")
