// The official openai Node SDK through sluice: only the base URL and key change.
// Run by tests/sdk.rs with SLUICE_BASE_URL and SLUICE_KEY; exits non-zero on failure.
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const client = new OpenAI({ baseURL: process.env.SLUICE_BASE_URL + '/v1', apiKey: process.env.SLUICE_KEY, maxRetries: 0 });

const r = await client.chat.completions.create({ model: 'chat-a', messages: [{ role: 'user', content: 'hi' }] });
assert.equal(r.choices[0].message.content, 'Hello from mock a1.');
assert.equal(r.model, 'a1-2025-04-14');
assert.equal(r.provider, 'openai:a1');
assert.ok(r.usage.total_tokens > 0);

const stream = await client.chat.completions.create({
  model: 'chat-a', stream: true, stream_options: { include_usage: true },
  messages: [{ role: 'user', content: 'hi' }],
});
let text = '';
let usage = null;
for await (const chunk of stream) {
  assert.equal(chunk.provider, 'openai:a1');
  if (chunk.usage) usage = chunk.usage;
  if (chunk.choices.length && chunk.choices[0].delta.content) text += chunk.choices[0].delta.content;
}
assert.equal(text, 'Hello from mock a1.');
assert.ok(usage && usage.total_tokens > 0);

await assert.rejects(
  client.chat.completions.create({ model: 'no-such-model', messages: [{ role: 'user', content: 'hi' }] }),
  (e) => e instanceof OpenAI.PermissionDeniedError && e.code === 'model_not_granted',
);
console.log('node sdk: ok');
