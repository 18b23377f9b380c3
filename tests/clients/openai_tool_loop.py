"""The openai Python SDK's documented tool loop on the chat route: the assistant
message is appended to `messages` exactly as the SDK returned it
(`completion.choices[0].message`, with whatever `annotations`, `refusal`, `audio`
or `function_call` it carries), the tool's result follows, and the same list goes
back; then the final answer goes back the same way with the user's next message
(a chat app's second message), streamed. On an OpenAI rung and on a Claude rung.
Each turn checks what reached the mock provider.

Run by tests/clients.rs; exits non-zero on failure.
"""
import json

import openai
from openai import OpenAI

from common import (BASE, KEY, WEATHER, WEATHER_ARGS, anthropic_blocks, case, expect,
                    finish, script, sent, tool_call)

client = OpenAI(base_url=BASE + "/v1", api_key=KEY, max_retries=0)
TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]},
    },
}]


def check_openai(body, call_id):
    """The second turn on an OpenAI rung: the assistant's tool call and the tool's
    answer as the caller sent them, without what only an answer carries."""
    msgs = body["messages"]
    expect([m["role"] for m in msgs] == ["user", "assistant", "tool"],
           "the second turn carries user, assistant, tool", msgs)
    a = msgs[1]
    expect(a["tool_calls"][0]["id"] == call_id
           and a["tool_calls"][0]["function"]["name"] == "get_weather"
           and json.loads(a["tool_calls"][0]["function"]["arguments"]) == WEATHER_ARGS,
           "the assistant's tool call reached the provider as returned", a)
    expect("annotations" not in a, "the output-only `annotations` is not forwarded", a)
    expect(msgs[2]["tool_call_id"] == call_id and msgs[2]["content"] == WEATHER,
           "the tool result reached the provider", msgs[2])


def check_anthropic(body, _call_id):
    """The same on a Claude rung: a tool_use block and its tool_result."""
    msgs = body["messages"]
    expect([m["role"] for m in msgs] == ["user", "assistant", "user"],
           "the second turn carries user, assistant, user", msgs)
    use = [b for b in anthropic_blocks(msgs[1]) if b["type"] == "tool_use"]
    expect(len(use) == 1 and use[0]["name"] == "get_weather" and use[0]["input"] == WEATHER_ARGS,
           "the assistant's tool call reached Claude as a tool_use block", msgs[1])
    res = [b for b in anthropic_blocks(msgs[2]) if b["type"] == "tool_result"]
    expect(len(res) == 1 and res[0]["tool_use_id"] == use[0]["id"],
           "the tool result reached Claude as a tool_result of that call", msgs[2])
    content = res[0]["content"]
    text = content if isinstance(content, str) else "".join(p.get("text", "") for p in content)
    expect(text == WEATHER, "the tool result's text reached Claude", res[0])


def answer_in_history(body, wire):
    """The text of the assistant message before the user's new message."""
    msgs = body["messages"]
    a = msgs[-2]
    expect(a["role"] == "assistant" and msgs[-1]["role"] == "user",
           "the assistant's answer precedes the user's new message", msgs)
    if wire == "openai":
        expect("annotations" not in a, "the output-only `annotations` is not forwarded", a)
        c = a["content"]
        return c if isinstance(c, str) else "".join(p["text"] for p in c)
    return "".join(b.get("text", "") for b in anthropic_blocks(a))


def loop(slug, upstream, wire, check):
    answer = f"Hello from mock {upstream}."
    script(upstream, tool_call())
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    completion = client.chat.completions.create(model=slug, messages=messages, tools=TOOLS)
    message = completion.choices[0].message
    expect(completion.choices[0].finish_reason == "tool_calls", "a tool call", completion)
    call = message.tool_calls[0]
    expect(call.function.name == "get_weather", "the tool asked for", message)

    # The documented loop: the message goes back as it is.
    messages.append(message)
    messages.append({"role": "tool", "tool_call_id": call.id, "content": WEATHER})
    n = len(sent(upstream))
    final = client.chat.completions.create(model=slug, messages=messages, tools=TOOLS)
    expect(final.choices[0].message.content == answer, "the answer after the tool", final)
    bodies = sent(upstream)
    expect(len(bodies) == n + 1, "one request reached the provider for turn 2", bodies[n:])
    check(bodies[-1], call.id)

    # A chat app's next message: the answer goes back as it is, streamed this time.
    messages += [final.choices[0].message, {"role": "user", "content": "And tomorrow?"}]
    stream = client.chat.completions.create(model=slug, messages=messages, tools=TOOLS,
                                            stream=True, stream_options={"include_usage": True})
    text, usage = "", None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
        if chunk.usage is not None:
            usage = chunk.usage
    expect(text == answer, "the third answer", text)
    expect(usage is not None and usage.prompt_tokens > 0, "the stream's usage", usage)
    expect(answer_in_history(sent(upstream)[-1], wire) == answer,
           "the previous answer reached the provider in the history", sent(upstream)[-1])


def still_refused(slug, upstream):
    """What the loop's fix must not let through: an unknown message key, and a
    non-null `function_call` or `audio` (SPEC.md), each the caller's 400 naming
    the message, with nothing sent upstream."""
    for extra in ({"agent": "planner"}, {"function_call": {"name": "f", "arguments": "{}"}},
                  {"audio": {"id": "audio_1"}}):
        history = [{"role": "user", "content": "hi"},
                   {"role": "assistant", "content": "Hello.", **extra},
                   {"role": "user", "content": "And?"}]
        try:
            client.chat.completions.create(model=slug, messages=history)
            expect(False, f"an assistant message with {extra} is refused")
        except openai.BadRequestError as e:
            expect(e.status_code == 400 and "messages[1]" in str(e.body),
                   f"{list(extra)[0]} is refused, naming messages[1]", e.body)
    expect(sent(upstream) == [], "nothing reached the provider", sent(upstream))


case("openai rung: append-the-message tool loop", loop, "cl-gpt", "cg1", "openai", check_openai)
case("claude rung: append-the-message tool loop", loop, "cl-claude", "cc1", "anthropic",
     check_anthropic)
case("openai rung: unknown keys and non-null function_call / audio stay refused", still_refused,
     "cl-gpt", "cg1")
case("claude rung: unknown keys and non-null function_call / audio stay refused", still_refused,
     "cl-claude", "cc1")
finish()
