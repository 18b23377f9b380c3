// The Vercel AI SDK (`ai` with `@ai-sdk/openai`'s default provider, i.e. the
// responses API with `store` left on) through the gateway, pointed at it by base
// URL and key only:
// - two turns with a tool: the second sends the earlier assistant text as an
//   `item_reference` to the stored response item (what every AI SDK chat app on
//   its default provider does), and the rung must get the item itself (issue 28
//   point 2);
// - `previousResponseId`: the next turn sends only the new message, and the rung
//   must get the whole conversation.
// Each turn checks what reached the mock provider. Run by tests/clients.rs.
import { createOpenAI } from '@ai-sdk/openai';
import { generateText, isStepCount, streamText, tool } from 'ai';
import { z } from 'zod';

const BASE = process.env.SLUICE_BASE_URL;
const KEY = process.env.SLUICE_KEY;
const MOCK = process.env.SLUICE_MOCK_URL;
const ANSWER = 'Hello from mock cg1.';
const WEATHER = 'Sunny, 21 C in Paris';

const openai = createOpenAI({ baseURL: `${BASE}/v1`, apiKey: KEY });
const tools = {
  get_weather: tool({
    description: 'The weather in a city.',
    inputSchema: z.object({ city: z.string() }),
    execute: async () => WEATHER,
  }),
};

async function mock(method, path, body) {
  const r = await fetch(MOCK + path, {
    method,
    headers: { 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return r.json();
}
const script = (model, ...steps) => mock('POST', '/_mock/script', { model, steps });
const toolCall = { kind: 'tool_call', name: 'get_weather', arguments: { city: 'Paris' } };
async function sent(model) {
  const all = await mock('GET', '/_mock/requests');
  return all.filter((r) => r.model === model && r.body).map((r) => JSON.parse(r.body));
}

function expect(cond, what, ...context) {
  if (!cond) {
    const shown = context.map((c) => JSON.stringify(c, null, 1)?.slice(0, 4000));
    throw new Error(`FAILED: ${what}\n${shown.join('\n')}`);
  }
}

// Each input item's type; a message's with its role and text.
function shape(items) {
  return items.map((i) => {
    const type = i.type ?? 'message';
    if (type !== 'message') return type;
    const c = i.content;
    const text = typeof c === 'string' ? c : (c ?? []).map((p) => p.text ?? '').join('');
    return `${i.role}: ${text}`;
  });
}

const failed = [];
async function runCase(name, fn) {
  console.error(`-- ${name}`);
  try {
    await mock('POST', '/_mock/clear');
    await fn();
    console.log(`PASS ${name}`);
  } catch (e) {
    failed.push(name);
    const lines = String(e?.message ?? e).split('\n');
    console.log(`FAIL ${name}: ${e?.name ?? 'Error'}: ${lines[0]}`);
    for (const l of lines.slice(1)) console.log(`    ${l}`);
    if (e?.responseBody) console.log(`    response: ${String(e.responseBody).slice(0, 600)}`);
  }
}

// streamText hands a failed call to onError and rejects with a generic error:
// the call's own error is the one to report.
async function streamedText(options) {
  let failure;
  const result = streamText({ ...options, onError: ({ error }) => { failure = error; } });
  try {
    const text = await result.text;
    if (failure) throw failure;
    return text;
  } catch (e) {
    throw failure ?? e;
  }
}

async function firstTurn(messages) {
  await script('cg1', toolCall);
  const first = await generateText({
    model: openai('cl-gpt'),
    tools,
    stopWhen: isStepCount(3),
    messages,
  });
  expect(first.text === ANSWER, 'the first turn answers after the tool', first.text);
  const bodies = await sent('cg1');
  expect(bodies.length === 2, 'two model calls: the tool call, then the answer', bodies);
  expect(
    JSON.stringify(shape(bodies[1].input)) ===
      JSON.stringify(['user: What is the weather in Paris?', 'function_call', 'function_call_output']),
    "the tool turn's input",
    bodies[1].input,
  );
  return first;
}

await runCase('two turns with a tool, the second by item_reference', async () => {
  const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
  const first = await firstTurn(messages);
  messages.push(...first.responseMessages, { role: 'user', content: 'And tomorrow?' });
  const text = await streamedText({ model: openai('cl-gpt'), tools, messages });
  expect(text === ANSWER, 'the second answer', text);
  const body = (await sent('cg1')).at(-1);
  const items = body.input;
  expect(
    !items.some((i) => i.type === 'item_reference'),
    'the rung gets the items themselves, not references it cannot resolve',
    items,
  );
  expect(
    JSON.stringify(shape(items)) ===
      JSON.stringify([
        'user: What is the weather in Paris?',
        'function_call',
        'function_call_output',
        `assistant: ${ANSWER}`,
        'user: And tomorrow?',
      ]),
    'turn 2 reached the rung as the whole conversation',
    shape(items),
    items,
  );
});

await runCase('previousResponseId continues the conversation', async () => {
  const first = await firstTurn([{ role: 'user', content: 'What is the weather in Paris?' }]);
  const responseId = first.providerMetadata?.openai?.responseId;
  expect(typeof responseId === 'string' && responseId.startsWith('resp_'), 'a response id', first.providerMetadata);
  const second = await generateText({
    model: openai('cl-gpt'),
    tools,
    messages: [{ role: 'user', content: 'And tomorrow?' }],
    providerOptions: { openai: { previousResponseId: responseId } },
  });
  expect(second.text === ANSWER, 'the continued answer', second.text);
  const body = (await sent('cg1')).at(-1);
  expect(!('previous_response_id' in body), 'the rung is sent the history, not an id', body);
  expect(
    JSON.stringify(shape(body.input)) ===
      JSON.stringify([
        'user: What is the weather in Paris?',
        'function_call',
        'function_call_output',
        `assistant: ${ANSWER}`,
        'user: And tomorrow?',
      ]),
    'the continued turn reached the rung as the whole conversation',
    shape(body.input),
    body.input,
  );
});

if (failed.length) {
  console.log(`${failed.length} case(s) failed: ${failed.join(', ')}`);
  process.exit(1);
}
