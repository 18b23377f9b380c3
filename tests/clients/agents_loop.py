"""openai-agents (the OpenAI Agents SDK) through the gateway, pointed at it the
documented way for another endpoint: `set_default_openai_client` with an
`AsyncOpenAI(base_url=..., api_key=...)`, tracing off (it would export to
OpenAI). On the responses API (the SDK's default) and on chat completions
(`set_default_openai_api("chat_completions")`):

- a tool loop over two turns: the run calls the tool and answers; the next run
  sends `result.to_input_list()` with the user's next message;
- with `previous_response_id=result.last_response_id` (responses only): the next
  run sends only the new message, and the rung must get the whole conversation;
- the same on a Claude rung (the gateway translates the responses API), where
  the Response objects are the gateway's own.

Each turn checks what reached the mock provider. Run by tests/clients.rs.
"""
import asyncio

from agents import (Agent, Runner, function_tool, set_default_openai_api,
                    set_default_openai_client, set_tracing_disabled)
from openai import AsyncOpenAI

from common import (BASE, KEY, WEATHER, WEATHER_ARGS, anthropic_blocks, case, expect, finish,
                    input_items, item_text, script, sent, tool_call)

ANSWER = "Hello from mock cg1."
set_tracing_disabled(True)


def on_gateway(api, turns):
    """Runs `turns` with the SDK pointed at the gateway the documented way for
    another endpoint; a client per case, since each case has an event loop of
    its own."""
    async def main():
        client = AsyncOpenAI(base_url=BASE + "/v1", api_key=KEY, max_retries=0)
        set_default_openai_client(client, use_for_tracing=False)
        set_default_openai_api(api)
        try:
            await turns()
        finally:
            await client.close()
    asyncio.run(main())


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return WEATHER


def agent():
    return Agent(name="Forecaster", instructions="Answer with the weather.", model="cl-gpt",
                 tools=[get_weather])


def responses_kinds(body):
    """Each input item's type; a message's with its role."""
    kinds = []
    for i in input_items(body):
        kind = i.get("type", "message")
        kinds.append(f"message:{i.get('role')}" if kind == "message" else kind)
    return kinds


async def first_run(streamed):
    """Turn 1: the tool call and the answer; checks the model's second call."""
    script("cg1", tool_call())
    if streamed:
        result = Runner.run_streamed(agent(), "What is the weather in Paris?")
        async for _ in result.stream_events():
            pass
    else:
        result = await Runner.run(agent(), "What is the weather in Paris?")
    expect(result.final_output == ANSWER, "the run's answer", result.final_output)
    return result


def check_tool_turn_responses(body):
    items = input_items(body)
    calls = [i for i in items if i.get("type") == "function_call"]
    outputs = [i for i in items if i.get("type") == "function_call_output"]
    expect(len(calls) == 1 and calls[0]["name"] == "get_weather", "the tool call went back", items)
    expect(len(outputs) == 1 and outputs[0]["call_id"] == calls[0]["call_id"]
           and WEATHER in str(outputs[0]["output"]), "the tool's answer went back, tied", items)


def tool_loop_responses():
    async def go():
        result = await first_run(streamed=False)
        bodies = sent("cg1")
        expect(len(bodies) == 2, "two model calls in turn 1", bodies)
        check_tool_turn_responses(bodies[1])
        # Turn 2: the whole history as the SDK gives it, streamed this time.
        nxt = result.to_input_list() + [{"role": "user", "content": "And tomorrow?"}]
        again = Runner.run_streamed(agent(), nxt)
        async for _ in again.stream_events():
            pass
        expect(again.final_output == ANSWER, "the second run's answer", again.final_output)
        body = sent("cg1")[-1]
        kinds = responses_kinds(body)
        expect(kinds == ["message:user", "function_call", "function_call_output",
                         "message:assistant", "message:user"],
               "turn 2 reached the rung as the whole conversation", kinds, body)
        items = input_items(body)
        expect(item_text(items[3]) == ANSWER and item_text(items[4]) == "And tomorrow?",
               "the answer and the new message close the history", items)
    on_gateway("responses", go)


def previous_response_id():
    async def go():
        result = await first_run(streamed=True)
        expect(result.last_response_id and result.last_response_id.startswith("resp_"),
               "the run names its last response", result.last_response_id)
        again = await Runner.run(agent(), "And tomorrow?",
                                 previous_response_id=result.last_response_id)
        expect(again.final_output == ANSWER, "the continued run's answer", again.final_output)
        body = sent("cg1")[-1]
        expect("previous_response_id" not in body, "the rung is sent the history, not an id",
               body)
        kinds = responses_kinds(body)
        expect(kinds == ["message:user", "function_call", "function_call_output",
                         "message:assistant", "message:user"],
               "the continued turn reached the rung as the whole conversation", kinds, body)
    on_gateway("responses", go)


def tool_loop_chat():
    async def go():
        result = await first_run(streamed=False)
        body = sent("cg1")[-1]
        roles = [m["role"] for m in body["messages"]]
        expect(roles == ["system", "user", "assistant", "tool"], "the tool turn's messages",
               roles, body)
        call = body["messages"][2]["tool_calls"][0]
        expect(call["function"]["name"] == "get_weather"
               and body["messages"][3]["tool_call_id"] == call["id"],
               "the tool call and its answer, tied", body["messages"])
        nxt = result.to_input_list() + [{"role": "user", "content": "And tomorrow?"}]
        again = Runner.run_streamed(agent(), nxt)
        async for _ in again.stream_events():
            pass
        expect(again.final_output == ANSWER, "the second run's answer", again.final_output)
        msgs = sent("cg1")[-1]["messages"]
        expect([m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "assistant",
                                             "user"],
               "turn 2 reached the rung as the whole conversation", msgs)
        for m in msgs:
            expect("annotations" not in m, "no output-only `annotations` is forwarded", m)
    on_gateway("chat_completions", go)


def on_claude():
    async def go():
        claude = Agent(name="Forecaster", instructions="Answer with the weather.",
                       model="cl-claude", tools=[get_weather])
        script("cc1", tool_call())
        result = await Runner.run(claude, "What is the weather in Paris?")
        expect(result.final_output == "Hello from mock cc1.", "the run's answer",
               result.final_output)
        nxt = result.to_input_list() + [{"role": "user", "content": "And tomorrow?"}]
        again = Runner.run_streamed(claude, nxt)
        async for _ in again.stream_events():
            pass
        expect(again.final_output == "Hello from mock cc1.", "the second run's answer",
               again.final_output)
        last = await Runner.run(claude, "And then?", previous_response_id=again.last_response_id)
        expect(last.final_output == "Hello from mock cc1.", "the continued run's answer",
               last.final_output)
        body = sent("cc1")[-1]
        msgs = body["messages"]
        expect([m["role"] for m in msgs] == ["user", "assistant", "user", "assistant", "user",
                                             "assistant", "user"],
               "the continued turn reached Claude as the whole conversation", msgs)
        use = [b for b in anthropic_blocks(msgs[1]) if b["type"] == "tool_use"]
        result_block = [b for b in anthropic_blocks(msgs[2]) if b["type"] == "tool_result"]
        expect(use and use[0]["input"] == WEATHER_ARGS and result_block
               and result_block[0]["tool_use_id"] == use[0]["id"],
               "the tool call and its result, tied, in Claude's terms", msgs[1:3])
        expect(body.get("system") == "Answer with the weather.", "the instructions", body)
    on_gateway("responses", go)


case("responses: a tool loop over two turns", tool_loop_responses)
case("responses: previous_response_id continues the conversation", previous_response_id)
case("responses on a Claude rung: a tool loop, the next turn, previous_response_id",
     on_claude)
case("chat completions: a tool loop over two turns", tool_loop_chat)
finish()
