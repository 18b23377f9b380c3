"""pydantic-ai with an OpenAI model pointed at the gateway (`OpenAIProvider` with
base URL and key): a tool call and its answer in one run, then the next run with
`message_history=result.all_messages()`; on the chat route (`OpenAIChatModel`)
and on the responses route (`OpenAIResponsesModel`). Each turn checks what
reached the mock provider.

Run by tests/clients.rs; exits non-zero on failure.
"""
import asyncio

from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.openai import OpenAIProvider

from common import (BASE, KEY, WEATHER, WEATHER_ARGS, case, expect, finish, input_items,
                    item_text, script, sent, tool_call)

ANSWER = "Hello from mock cg1."


def make_agent(model_class):
    provider = OpenAIProvider(base_url=BASE + "/v1", api_key=KEY)
    agent = Agent(model_class("cl-gpt", provider=provider), instructions="Answer briefly.")

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return WEATHER

    return agent


def chat():
    agent = make_agent(OpenAIChatModel)
    script("cg1", tool_call())
    first = agent.run_sync("What is the weather in Paris?")
    expect(first.output == ANSWER, "the first run's answer", first.output)
    bodies = sent("cg1")
    expect(len(bodies) == 2, "two model calls: the tool call, then the answer", bodies)
    msgs = bodies[1]["messages"]
    expect([m["role"] for m in msgs] == ["system", "user", "assistant", "tool"],
           "the tool turn's messages", msgs)
    call = msgs[2]["tool_calls"][0]
    expect(call["function"]["name"] == "get_weather" and msgs[3]["tool_call_id"] == call["id"]
           and msgs[3]["content"] == WEATHER, "the tool call and its answer, tied", msgs)

    second = agent.run_sync("And tomorrow?", message_history=first.all_messages())
    expect(second.output == ANSWER, "the second run's answer", second.output)
    msgs = sent("cg1")[-1]["messages"]
    expect([m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "assistant",
                                         "user"],
           "turn 2 reached the rung as the whole conversation", msgs)
    expect(msgs[4]["content"] == ANSWER and msgs[5]["content"] == "And tomorrow?",
           "the answer and the new message close the history", msgs)


def responses():
    agent = make_agent(OpenAIResponsesModel)
    script("cg1", tool_call())
    first = agent.run_sync("What is the weather in Paris?")
    expect(first.output == ANSWER, "the first run's answer", first.output)
    items = input_items(sent("cg1")[1])
    kinds = [i.get("type", "message") for i in items]
    expect(kinds == ["message", "function_call", "function_call_output"],
           "the tool turn's input", items)
    expect(items[1]["call_id"] == items[2]["call_id"] and items[2]["output"] == WEATHER,
           "the call and its output, tied", items)

    # The next run, streamed.
    async def stream():
        async with agent.run_stream("And tomorrow?",
                                    message_history=first.all_messages()) as run:
            return await run.get_output()
    output = asyncio.run(stream())
    expect(output == ANSWER, "the second run's answer", output)
    items = input_items(sent("cg1")[-1])
    kinds = [i.get("type", "message") for i in items]
    expect(kinds == ["message", "function_call", "function_call_output", "message", "message"],
           "turn 2 reached the rung as the whole conversation", items)
    expect(item_text(items[3]) == ANSWER and item_text(items[4]) == "And tomorrow?",
           "the answer and the new message close the history", items)


case("chat: a tool call, then the next run with the history", chat)
case("responses: a tool call, then the next run with the history, streamed", responses)
finish()
