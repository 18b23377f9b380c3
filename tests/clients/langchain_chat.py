"""LangChain's ChatOpenAI on the chat route: a tool call, the tool's answer, then
the user's next message, each turn sending the whole history as LangChain keeps
it (AIMessage, ToolMessage); on an OpenAI rung and on a Claude rung. Each turn
checks what reached the mock provider.

Run by tests/clients.rs; exits non-zero on failure.
"""
import json

from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from common import (BASE, KEY, WEATHER, WEATHER_ARGS, anthropic_blocks, case, expect,
                    finish, script, sent, tool_call)


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return WEATHER


def history_openai(body):
    """(roles, the assistant's tool call, the tool's answer) as an OpenAI rung got them."""
    msgs = body["messages"]
    calls = [m for m in msgs if m["role"] == "assistant" and m.get("tool_calls")]
    results = [m for m in msgs if m["role"] == "tool"]
    for m in msgs:
        expect("annotations" not in m, "no output-only `annotations` is forwarded", m)
    call = calls[0]["tool_calls"][0] if calls else None
    return ([m["role"] for m in msgs],
            call and (call["id"], call["function"]["name"],
                      json.loads(call["function"]["arguments"])),
            results and (results[0]["tool_call_id"], results[0]["content"]))


def history_anthropic(body):
    msgs = body["messages"]
    uses = [b for m in msgs for b in anthropic_blocks(m) if b["type"] == "tool_use"]
    results = [b for m in msgs for b in anthropic_blocks(m) if b["type"] == "tool_result"]
    call = uses[0] if uses else None
    result = results[0] if results else None
    content = result and result["content"]
    text = content if isinstance(content, str) else "".join(
        p.get("text", "") for p in content or [])
    roles = [m["role"] for m in msgs]
    return (roles, call and (call["id"], call["name"], call["input"]),
            result and (result["tool_use_id"], text))


def loop(slug, upstream, history, roles2, roles3):
    answer = f"Hello from mock {upstream}."
    # With a base URL of its own LangChain asks no stream usage unless told to.
    llm = ChatOpenAI(model=slug, base_url=BASE + "/v1", api_key=KEY, max_retries=0,
                     stream_usage=True)
    llm = llm.bind_tools([get_weather])
    script(upstream, tool_call())
    messages = [HumanMessage("What is the weather in Paris?")]
    first = llm.invoke(messages)
    expect(first.tool_calls and first.tool_calls[0]["name"] == "get_weather"
           and first.tool_calls[0]["args"] == WEATHER_ARGS, "a tool call", first)
    messages += [first, ToolMessage(get_weather.invoke(first.tool_calls[0]["args"]),
                                    tool_call_id=first.tool_calls[0]["id"])]

    second = llm.invoke(messages)
    expect(second.content == answer, "the answer after the tool", second)
    roles, call, result = history(sent(upstream)[-1])
    expect(roles == roles2, f"turn 2 carries {roles2}", roles, sent(upstream)[-1])
    expect(call is not None and call[1:] == ("get_weather", WEATHER_ARGS),
           "the tool call reached the provider", call)
    expect(result is not None and result == (call[0], WEATHER),
           "the tool's answer reached the provider, tied to its call", result)

    # The user's next message, streamed.
    messages += [second, HumanMessage("And tomorrow?")]
    streamed = None
    for chunk in llm.stream(messages):
        streamed = chunk if streamed is None else streamed + chunk
    expect(streamed.content == answer, "the third answer", streamed)
    expect(streamed.usage_metadata and streamed.usage_metadata["input_tokens"] > 0,
           "the stream's usage", streamed.usage_metadata)
    roles, call, result = history(sent(upstream)[-1])
    expect(roles == roles3, f"turn 3 carries {roles3}", roles, sent(upstream)[-1])


case("openai rung: ChatOpenAI tool call and next message", loop, "cl-gpt", "cg1",
     history_openai, ["user", "assistant", "tool"], ["user", "assistant", "tool", "assistant", "user"])
case("claude rung: ChatOpenAI tool call and next message", loop, "cl-claude", "cc1",
     history_anthropic, ["user", "assistant", "user"], ["user", "assistant", "user", "assistant", "user"])
finish()
