"""The official openai Python SDK's Files and Batches calls through sluice.

Run by tests/sdk.rs with SLUICE_BASE_URL and SLUICE_KEY (the mock answers each
request after a short delay); exits non-zero on failure.
"""
import json
import os
import sys
import time

import openai
from openai import OpenAI

client = OpenAI(base_url=os.environ["SLUICE_BASE_URL"] + "/v1",
                api_key=os.environ["SLUICE_KEY"], max_retries=0)


def jsonl(n, prefix):
    return "\n".join(json.dumps({
        "custom_id": f"{prefix}-{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": "chat-a", "messages": [{"role": "user", "content": "hi"}]},
    }) for i in range(n)).encode() + b"\n"


def wait(batch_id, statuses, within=30):
    deadline = time.time() + within
    while True:
        b = client.batches.retrieve(batch_id)
        if b.status in statuses:
            return b
        assert time.time() < deadline, b
        time.sleep(0.2)


data = jsonl(3, "sdk")
f = client.files.create(file=("input.jsonl", data), purpose="batch")
assert f.object == "file" and f.purpose == "batch" and f.bytes == len(data), f
assert client.files.retrieve(f.id).filename == "input.jsonl"
assert f.id in [x.id for x in client.files.list(purpose="batch").data]

b = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                          completion_window="24h", metadata={"run": "sdk"})
assert b.object == "batch" and b.metadata == {"run": "sdk"}, b
b = wait(b.id, {"completed", "failed", "expired", "cancelled"})
assert b.status == "completed", b
assert b.request_counts.total == 3 and b.request_counts.completed == 3, b.request_counts
out = [json.loads(l) for l in client.files.content(b.output_file_id).text.splitlines()]
assert sorted(l["custom_id"] for l in out) == ["sdk-0", "sdk-1", "sdk-2"], out
for l in out:
    assert l["response"]["status_code"] == 200, l
    assert l["response"]["body"]["choices"][0]["message"]["content"] == "Hello from mock a1.", l
assert b.id in [x.id for x in client.batches.list(limit=10).data]

# Cancel: the batch stops taking lines and ends cancelled with what was done.
many = client.files.create(file=("many.jsonl", jsonl(40, "c")), purpose="batch")
c = client.batches.create(input_file_id=many.id, endpoint="/v1/chat/completions",
                          completion_window="24h")
c = client.batches.cancel(c.id)
assert c.status in ("cancelling", "cancelled"), c
c = wait(c.id, {"cancelled"})
assert c.request_counts.completed < 40, c.request_counts

# A bad purpose is a 400 naming the parameter.
try:
    client.files.create(file=("x.jsonl", b"{}"), purpose="homework")
    sys.exit("expected a 400")
except openai.BadRequestError as e:
    assert e.param == "purpose", e

deleted = client.files.delete(f.id)
assert deleted.deleted and deleted.id == f.id, deleted
try:
    client.files.retrieve(f.id)
    sys.exit("expected a 404")
except openai.NotFoundError:
    pass
print("ok")
