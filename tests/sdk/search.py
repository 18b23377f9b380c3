"""Web search and tool search through sluice with the official openai (chat,
responses) and anthropic (messages) Python SDKs, whole and streamed: the gateway
runs the search (a fake SearXNG) and cites it; tool search rounds end in a call of
the tool the search loaded.

Run by tests/sdk.rs with SLUICE_BASE_URL, SLUICE_KEY and SLUICE_MOCK_URL (the mock
provider's control API, to script its answers); exits non-zero on failure.
"""
import json
import os
import urllib.request

import anthropic
from openai import OpenAI

base, key, mock = (os.environ[k] for k in ("SLUICE_BASE_URL", "SLUICE_KEY", "SLUICE_MOCK_URL"))
QUESTION = "What is new in Rust?"
URL = "https://blog.rust-lang.org/2025/09/18/Rust-1.90.0/"
CITED = f"Rust 1.90 is out [blog.rust-lang.org]({URL})."
LINK = CITED[CITED.index("["):CITED.index(")") + 1]
START = CITED.index("[")


def script(model, *steps):
    req = urllib.request.Request(mock + "/_mock/script", method="POST",
                                 data=json.dumps({"model": model, "steps": list(steps)}).encode(),
                                 headers={"content-type": "application/json"})
    urllib.request.urlopen(req).read()


def cited():
    return {"kind": "text", "text": CITED}


def search_then_call():
    return ({"kind": "call_if_declared", "name": "tool_search", "arguments": {"query": "weather"}},
            {"kind": "call_if_declared", "name": "get_weather", "arguments": {"city": "Paris"}})


oa = OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
an = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
ask = [{"role": "user", "content": QUESTION}]

# --- Web search, chat: web_search_options whole, the web plugin streamed.
script("g1", cited())
r = oa.chat.completions.create(model="ws-gpt", messages=ask, web_search_options={})
note = r.choices[0].message.annotations[0]
assert note.type == "url_citation" and note.url_citation.url == URL, r
assert (note.url_citation.start_index, note.url_citation.end_index) == (START, START + len(LINK)), note
assert r.to_dict()["usage"]["server_tool_use_details"]["web_search_requests"] == 1, r.usage

script("g1", cited())
stream = oa.chat.completions.create(model="ws-gpt", messages=ask, stream=True,
                                    stream_options={"include_usage": True},
                                    extra_body={"plugins": [{"id": "web"}]})
text, notes, usage = "", [], None
for chunk in stream:
    if chunk.usage:
        usage = chunk.to_dict()["usage"]
    if chunk.choices:
        delta = chunk.choices[0].delta.to_dict()
        text += delta.get("content") or ""
        notes += delta.get("annotations") or []
assert text == CITED, text
assert [n["url_citation"]["url"] for n in notes] == [URL], notes
assert usage["server_tool_use_details"]["web_search_requests"] == 1, usage

# --- Web search, responses: the web_search tool, whole and streamed.
script("g1", cited())
r = oa.responses.create(model="ws-gpt", input=QUESTION, tools=[{"type": "web_search"}])
assert r.output[0].type == "web_search_call", r.output
assert r.output_text == CITED, r.output_text
a = r.output[1].content[0].annotations[0]
assert a.type == "url_citation" and a.url == URL and a.start_index == START, a

script("g1", cited())
added = []
with oa.responses.stream(model="ws-gpt", input=QUESTION,
                         tools=[{"type": "web_search_preview"}]) as s:
    for ev in s:
        if ev.type == "response.output_text.annotation.added":
            added.append(ev)
    final = s.get_final_response()
assert len(added) == 1 and added[0].annotation.url == URL, added
assert final.output_text == CITED, final
assert final.output[1].content[0].annotations[0].url == URL, final.output

# --- Web search, messages: a web_search_ server tool, whole and streamed.
tools = [{"type": "web_search_20250305", "name": "web_search", "max_uses": 1}]
script("c1", cited())
m = an.messages.create(model="ws-claude", max_tokens=256, messages=ask, tools=tools)
assert [b.type for b in m.content[:2]] == ["server_tool_use", "web_search_tool_result"], m.content
assert m.content[0].input["query"] == QUESTION, m.content[0]
assert m.content[1].content[0].url == URL, m.content[1]
with_citations = [b for b in m.content if b.type == "text" and b.citations]
assert with_citations[0].citations[0].url == URL, m.content
assert m.usage.server_tool_use.web_search_requests == 1, m.usage

script("c1", cited())
with an.messages.stream(model="ws-claude", max_tokens=256, messages=ask, tools=tools) as s:
    streamed = "".join(s.text_stream)
    final = s.get_final_message()
assert streamed == CITED, streamed
assert final.content[0].type == "server_tool_use" and final.content[0].input["query"] == QUESTION, final
assert any(b.type == "text" and b.citations and b.citations[0].url == URL for b in final.content), final
assert final.usage.server_tool_use.web_search_requests == 1, final.usage

# --- Tool search, chat: deferred tools, the gateway's search rounds.
weather = {"type": "object", "properties": {"city": {"type": "string"}}}
chat_tools = [{"type": "service:tool_search"},
              {"type": "function", "defer_loading": True,
               "function": {"name": "get_weather", "description": "Weather for a city", "parameters": weather}},
              {"type": "function", "defer_loading": True,
               "function": {"name": "send_email", "description": "Send an email", "parameters": weather}}]
script("g1", *search_then_call())
r = oa.chat.completions.create(model="ws-gpt", messages=ask, tools=chat_tools)
call = r.choices[0].message.tool_calls[0]
assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}, r

script("g1", *search_then_call())
names = []
for chunk in oa.chat.completions.create(model="ws-gpt", messages=ask, tools=chat_tools, stream=True):
    for c in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
        if c.function and c.function.name:
            names.append(c.function.name)
assert names == ["get_weather"], names

# --- Tool search, responses.
resp_tools = [{"type": "tool_search"},
              {"type": "function", "name": "get_weather", "description": "Weather for a city",
               "defer_loading": True, "parameters": weather}]
script("g1", *search_then_call())
r = oa.responses.create(model="ws-gpt", input=QUESTION, tools=resp_tools)
calls = [i for i in r.output if i.type == "function_call"]
assert [c.name for c in calls] == ["get_weather"], r.output

script("g1", *search_then_call())
with oa.responses.stream(model="ws-gpt", input=QUESTION, tools=resp_tools) as s:
    final = s.get_final_response()
assert [i.name for i in final.output if i.type == "function_call"] == ["get_weather"], final.output

# --- Tool search, messages (BM25 declaration).
msg_tools = [{"type": "tool_search_tool_bm25_20251119", "name": "tool_search"},
             {"name": "get_weather", "description": "Weather for a city", "input_schema": weather,
              "defer_loading": True}]
script("c1", *search_then_call())
m = an.messages.create(model="ws-claude", max_tokens=256, messages=ask, tools=msg_tools)
uses = [b for b in m.content if b.type == "tool_use"]
assert [u.name for u in uses] == ["get_weather"] and uses[0].input == {"city": "Paris"}, m.content
assert m.stop_reason == "tool_use", m.stop_reason

script("c1", *search_then_call())
with an.messages.stream(model="ws-claude", max_tokens=256, messages=ask, tools=msg_tools) as s:
    final = s.get_final_message()
assert [b.name for b in final.content if b.type == "tool_use"] == ["get_weather"], final.content

print("python search sdk: ok")
