// `trex serve` through the official OpenAI Node client (npm `openai`): every endpoint and request field the
// server supports, streamed and not. Run by test_server_openai_node.cpp as
//   node openai_client_test.cjs <node_modules dir> <base url>
// It asserts invariants (streamed == non-streamed, seeds repeat, n choices, stop strings cut, logprob shapes)
// and prints one JSON line of results that the C++ side compares with its own raw-HTTP requests.
'use strict';
const assert = require('node:assert/strict');
const path = require('node:path');
const OpenAI = require(path.join(process.argv[2], 'openai'));
const client = new OpenAI({ baseURL: process.argv[3], apiKey: 'unused', maxRetries: 0, timeout: 60000 });
const MODEL = 'tiny';
const messages = [{ role: 'user', content: 'minimise the total cost of each warehouse' }];

async function collect(stream) {
  const byIndex = new Map();
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      const e = byIndex.get(c.index) || { text: '', logprobs: [], finish: null };
      if (c.delta && typeof c.delta.content === 'string') e.text += c.delta.content;
      if (typeof c.text === 'string') e.text += c.text;
      if (c.logprobs && c.logprobs.content) e.logprobs.push(...c.logprobs.content.map((x) => x.logprob));
      if (c.logprobs && c.logprobs.token_logprobs) e.logprobs.push(...c.logprobs.token_logprobs);
      if (c.finish_reason) e.finish = c.finish_reason;
      byIndex.set(c.index, e);
    }
  }
  return { byIndex, usage };
}

async function main() {
  const out = {};
  // GET /v1/models
  const models = await client.models.list();
  assert.equal(models.data[0].id, MODEL);

  // Chat, non-streamed: logprobs + top_logprobs, n, seed, penalties.
  const base = { model: MODEL, messages, max_tokens: 8, temperature: 0.8, seed: 7 };
  const chat = await client.chat.completions.create({ ...base, logprobs: true, top_logprobs: 2, n: 2,
    presence_penalty: 0.5, frequency_penalty: 0.5 });
  assert.equal(chat.object, 'chat.completion');
  assert.equal(chat.choices.length, 2);
  for (const c of chat.choices) {
    assert.ok(['stop', 'length'].includes(c.finish_reason));
    assert.ok(Array.isArray(c.logprobs.content));
    for (const e of c.logprobs.content) {
      assert.equal(typeof e.token, 'string');
      assert.ok(e.logprob <= 0);
      assert.ok(Array.isArray(e.bytes));
      assert.equal(e.top_logprobs.length, 2);
      assert.ok(e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob);
    }
  }
  assert.equal(chat.usage.completion_tokens,
    chat.choices.reduce((s, c) => s + c.token_ids.length, 0));
  const again = await client.chat.completions.create({ ...base, logprobs: true, top_logprobs: 2, n: 2,
    presence_penalty: 0.5, frequency_penalty: 0.5 });
  assert.deepEqual(again.choices.map((c) => c.message.content), chat.choices.map((c) => c.message.content));
  out.chat_n2 = chat.choices.map((c) => c.token_ids);

  // Chat, streamed with usage and logprobs: the same text and logprobs as non-streamed.
  const streamed = await collect(await client.chat.completions.create({ ...base, logprobs: true, top_logprobs: 2,
    n: 2, presence_penalty: 0.5, frequency_penalty: 0.5, stream: true, stream_options: { include_usage: true } }));
  for (const c of chat.choices) {
    const s = streamed.byIndex.get(c.index);
    assert.equal(s.text, c.message.content);
    assert.equal(s.finish, c.finish_reason);
    assert.deepEqual(s.logprobs, c.logprobs.content.map((x) => x.logprob));
  }
  assert.equal(streamed.usage.completion_tokens, chat.usage.completion_tokens);

  // Stop: a piece of a greedy completion ends the next one there and is not returned.
  const greedy = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 16, temperature: 0,
    ignore_eos: true });
  const text = greedy.choices[0].message.content;
  out.chat_greedy = greedy.choices[0].token_ids;
  // Two characters that first occur at i, away from replaced (non UTF-8) bytes.
  let stop = '';
  for (let i = 2; i + 2 <= text.length && !stop; ++i) {
    const cand = text.slice(i, i + 2);
    if (!/[\uFFFD\uD800-\uDFFF]/.test(cand) && text.indexOf(cand) === i) stop = cand;
  }
  const cut = text.indexOf(stop);
  assert.ok(stop.length === 2, 'no stop string candidate in ' + JSON.stringify(text));
  {
    const stopped = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 16, temperature: 0,
      ignore_eos: true, stop: [stop] });
    assert.equal(stopped.choices[0].finish_reason, 'stop');
    assert.equal(stopped.choices[0].message.content, text.slice(0, cut));
    const ss = await collect(await client.chat.completions.create({ model: MODEL, messages, max_tokens: 16,
      temperature: 0, ignore_eos: true, stop: stop, stream: true }));
    assert.equal(ss.byIndex.get(0).text, text.slice(0, cut));
    out.stop = stop;
  }

  // Completions: a string, token ids, a list of prompts; logprobs; n; seed; streamed.
  const cbase = { model: MODEL, prompt: 'the demand of each customer', max_tokens: 6, temperature: 0 };
  const comp = await client.completions.create({ ...cbase, logprobs: 3 });
  assert.equal(comp.object, 'text_completion');
  const lp = comp.choices[0].logprobs;
  assert.equal(lp.tokens.length, lp.token_logprobs.length);
  assert.equal(lp.tokens.length, lp.text_offset.length);
  assert.equal(lp.top_logprobs.length, lp.tokens.length);
  // Byte offsets into the completion (a token that is not valid UTF-8 on its own shows as U+FFFD here).
  assert.equal(lp.text_offset[0], 0);
  lp.text_offset.forEach((o, i) => { if (i > 0) assert.ok(o >= lp.text_offset[i - 1]); });
  lp.token_logprobs.forEach((x) => assert.ok(x <= 0));
  out.completion_greedy = comp.choices[0].token_ids;
  const byIds = await client.completions.create({ ...cbase, prompt: [0, 17, 99, 23] });
  out.completion_ids = byIds.choices[0].token_ids;
  const two = await client.completions.create({ ...cbase, prompt: ['the demand of each customer', 'cost'] });
  assert.equal(two.choices.length, 2);
  assert.equal(two.choices[0].text, comp.choices[0].text);
  const sampled = { ...cbase, temperature: 1.0, seed: 99, n: 3, max_tokens: 5 };
  const cn = await client.completions.create(sampled);
  assert.equal(cn.choices.length, 3);
  const cs = await collect(await client.completions.create({ ...sampled, stream: true,
    stream_options: { include_usage: true } }));
  for (const c of cn.choices) assert.equal(cs.byIndex.get(c.index).text, c.text);
  assert.equal(cs.usage.completion_tokens, cn.usage.completion_tokens);
  out.completion_n3 = cn.choices.map((c) => c.token_ids);

  // Errors: an unknown model is a 404, a bad field a 400, both as the client's typed errors.
  await assert.rejects(client.chat.completions.create({ ...base, model: 'gpt-4o' }),
    (e) => e instanceof OpenAI.NotFoundError && e.status === 404 && e.code === 'model_not_found');
  await assert.rejects(client.completions.create({ ...cbase, model: 'nope' }), (e) => e.status === 404);
  await assert.rejects(client.chat.completions.create({ ...base, temperature: 1e-310 }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'temperature');
  await assert.rejects(client.completions.create({ ...cbase, max_tokens: 2 ** 62 }),
    (e) => e.status === 400 && e.code === 'context_length_exceeded');
  console.log(JSON.stringify(out));
}

main().catch((e) => {
  console.error('FAILED:', e && e.stack ? e.stack : e);
  process.exit(1);
});
