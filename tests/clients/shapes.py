"""Every OpenAI-format answer shape the gateway gives, for the schema check: the
chat, responses, embeddings and model-list routes, whole and streamed, with and
without `stream_options.include_usage`, text and tool calls, a reasoning summary,
an empty answer and a cut stream, on a rung of each kind (OpenAI, whose answer is
relayed; Claude and Gemini, whose answers are translated), every error envelope,
and the messages route's streams for its own stream rules. This script only makes
the requests (checking each status); validate.py judges every answer the tap
recorded.

Run by tests/clients.rs; exits non-zero on failure.
"""
import json
import urllib.error
import urllib.request

from openai import OpenAI

from common import BASE, KEY, case, expect, finish, script

RUNGS = [("cl-gpt", "cg1"), ("cl-claude", "cc1"), ("cl-gemini", "cm1")]
TOOLS_CHAT = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
TOOLS_RESPONSES = [{"type": "function", "name": "get_weather",
                    "description": "The weather in a city.",
                    "parameters": TOOLS_CHAT[0]["function"]["parameters"]}]
CALL = {"kind": "tool_call", "name": "get_weather", "arguments": {"city": "Paris"}}


def call(method, path, body=None, headers=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(BASE + path, data=data, method=method, headers={
        "authorization": f"Bearer {KEY}", "content-type": "application/json",
        **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def post(path, body, want=200, headers=None):
    status, text = call("POST", path, body, headers)
    expect(status == want, f"POST {path} answers {want}", status, text[:1500], body)
    return text


def chat(slug, upstream):
    user = [{"role": "user", "content": "Say hello"}]
    post("/v1/chat/completions", {"model": slug, "messages": user})
    post("/v1/chat/completions", {"model": slug, "messages": user, "stream": True})
    post("/v1/chat/completions", {"model": slug, "messages": user, "stream": True,
                                  "stream_options": {"include_usage": True}})
    for stream in (False, True):
        script(upstream, CALL)
        post("/v1/chat/completions", {"model": slug, "messages": user, "tools": TOOLS_CHAT,
                                      "stream": stream,
                                      **({"stream_options": {"include_usage": True}}
                                         if stream else {})})
    # An empty answer, and a stream the provider cuts, with and without usage.
    script(upstream, {"kind": "empty"}, {"kind": "cut_after", "n": 2},
           {"kind": "cut_after", "n": 2})
    post("/v1/chat/completions", {"model": slug, "messages": user, "stream": True,
                                  "stream_options": {"include_usage": True}})
    post("/v1/chat/completions", {"model": slug, "messages": user, "stream": True,
                                  "stream_options": {"include_usage": True}})
    post("/v1/chat/completions", {"model": slug, "messages": user, "stream": True})


def responses(slug, upstream):
    body = {"model": slug, "input": "Say hello", "instructions": "Be brief.",
            "temperature": 0.5, "top_p": 0.9, "metadata": {"ticket": "t-1"},
            "tools": TOOLS_RESPONSES, "tool_choice": "auto", "parallel_tool_calls": False}
    post("/v1/responses", body)
    post("/v1/responses", {**body, "stream": True})
    post("/v1/responses", {"model": slug, "input": "Say hello"})
    post("/v1/responses", {"model": slug, "input": "Say hello", "stream": True})
    for stream in (False, True):
        script(upstream, CALL)
        post("/v1/responses", {**body, "stream": stream})
    script(upstream, {"kind": "cut_after", "n": 2})
    post("/v1/responses", {"model": slug, "input": "Say hello", "stream": True})


def reasoning():
    body = {"model": "cl-gpt", "input": "Think", "reasoning": {"effort": "low", "summary": "auto"}}
    post("/v1/responses", body)
    post("/v1/responses", {**body, "stream": True})
    post("/v1/responses", {**body, "include": ["reasoning.encrypted_content"]})


def messages(slug, _upstream):
    body = {"model": slug, "max_tokens": 256, "messages": [{"role": "user", "content": "Say hello"}]}
    post("/v1/messages", body, headers={"anthropic-version": "2023-06-01"})
    post("/v1/messages", {**body, "stream": True}, headers={"anthropic-version": "2023-06-01"})


def other_routes():
    post("/v1/embeddings", {"model": "cl-embed", "input": ["one", "two"]})
    post("/v1/embeddings", {"model": "cl-embed", "input": "one", "encoding_format": "base64"})
    status, text = call("GET", "/v1/models")
    expect(status == 200, "GET /v1/models answers 200", status, text[:500])


def sdk_reads_response(slug, _upstream):
    """The openai SDK's typed Response: what the request set comes back, as OpenAI
    fills it (issue 28 point 5: `for t in resp.tools` must not meet None)."""
    client = OpenAI(base_url=BASE + "/v1", api_key=KEY, max_retries=0)
    asked = dict(model=slug, input="Say hello", instructions="Be brief.", temperature=0.5,
                 top_p=0.9, metadata={"ticket": "t-1"}, tools=TOOLS_RESPONSES,
                 tool_choice="auto", parallel_tool_calls=False)
    whole = client.responses.create(**asked)
    with client.responses.stream(**asked) as stream:
        for _ in stream:
            pass
        streamed = stream.get_final_response()
    for how, r in (("whole", whole), ("streamed", streamed)):
        # A parameter the rung could not use (disclosed as ignored) may read as
        # null, or any boolean for parallel_tool_calls, which is never null.
        ignored = str(r.to_dict().get("x-service-ignored-parameters") or "").split(",")
        wrong = []
        if not isinstance(r.tools, list) or [t.name for t in r.tools] != ["get_weather"]:
            wrong.append(f"tools={r.tools!r}")
        for member, want in (("tool_choice", "auto"), ("parallel_tool_calls", False),
                             ("instructions", "Be brief."), ("temperature", 0.5),
                             ("top_p", 0.9), ("metadata", {"ticket": "t-1"})):
            got = getattr(r, member)
            if member in ignored and (isinstance(got, bool) if member == "parallel_tool_calls"
                                      else got in (want, None)):
                continue
            if got != want:
                wrong.append(f"{member}={got!r}")
        expect(not wrong, f"the {how} Response repeats the request: {', '.join(wrong)}",
               r.to_dict())


def errors():
    user = [{"role": "user", "content": "hi"}]
    post("/v1/chat/completions", {"model": "cl-gpt", "messages": user, "temperature": 9}, 400)
    post("/v1/chat/completions", {"model": "cl-gpt"}, 400)
    post("/v1/chat/completions", {"model": "cl-gpt", "messages": user, "stream": True,
                                  "n": "x"}, 400)
    post("/v1/responses", {"model": "cl-gpt", "input": "hi", "previous_response_id": "resp_x"},
         400)
    post("/v1/responses", {"model": "cl-gpt"}, 400)
    post("/v1/embeddings", {"model": "cl-embed"}, 400)
    status, _ = call("POST", "/v1/chat/completions", {"model": "no-such-model", "messages": user})
    expect(400 <= status < 500, "an unknown model is the caller's error", status)
    status, _ = call("GET", "/v1/models", headers={"authorization": "Bearer xpl_" + "0" * 40})
    expect(status == 401, "a bad key is 401", status)
    # A provider's own failure after every rung: the gateway's 5xx envelope.
    script("cg1", {"kind": "status", "status": 500})
    status, _ = call("POST", "/v1/chat/completions", {"model": "cl-gpt", "messages": user})
    expect(status >= 500, "every rung failing is a server error", status)


for slug, upstream in RUNGS:
    case(f"chat on {slug}", chat, slug, upstream)
    case(f"responses on {slug}", responses, slug, upstream)
    case(f"messages on {slug}", messages, slug, upstream)
    case(f"openai SDK reads a Response on {slug}", sdk_reads_response, slug, upstream)
case("responses with a reasoning summary", reasoning)
case("embeddings and the model list", other_routes)
case("error envelopes", errors)
finish()
