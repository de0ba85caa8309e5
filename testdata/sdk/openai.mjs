// Drives OpenAI's official SDK through Tollgate for sdk_test.go:
//   node openai.mjs <baseURL> <chat|chat-stream|responses|responses-stream> <answer> <max tokens>
// The X-Answer header names the test upstream's canned answer. Prints one
// JSON line: {"status":200,"usage":{...},"text":"..."} or {"status":429,...}.
import OpenAI from 'openai';

const [, , baseURL, mode, answer, maxTokens] = process.argv;
const client = new OpenAI({
  apiKey: 'sdk-key',
  baseURL: baseURL + '/v1',
  maxRetries: 0,
  defaultHeaders: { 'X-Answer': answer },
});
const model = 'gpt-5-mini';
try {
  let usage = null;
  let text = '';
  switch (mode) {
    case 'chat': {
      const c = await client.chat.completions.create({
        model,
        max_completion_tokens: Number(maxTokens),
        messages: [{ role: 'user', content: 'hi' }],
      });
      usage = c.usage;
      text = c.choices[0].message.content;
      break;
    }
    case 'chat-stream': {
      const stream = await client.chat.completions.create({
        model,
        max_completion_tokens: Number(maxTokens),
        messages: [{ role: 'user', content: 'hi' }],
        stream: true,
        stream_options: { include_usage: true },
      });
      for await (const chunk of stream) {
        text += chunk.choices[0]?.delta?.content ?? '';
        if (chunk.usage) usage = chunk.usage;
      }
      break;
    }
    case 'responses': {
      const r = await client.responses.create({ model, input: 'hi', max_output_tokens: Number(maxTokens) });
      usage = r.usage;
      text = r.output_text;
      break;
    }
    case 'responses-stream': {
      const stream = await client.responses.create({ model, input: 'hi', max_output_tokens: Number(maxTokens), stream: true });
      for await (const ev of stream) {
        if (ev.type === 'response.output_text.delta') text += ev.delta;
        if (ev.type === 'response.completed') usage = ev.response.usage;
      }
      break;
    }
    default:
      throw new Error('mode: ' + mode);
  }
  console.log(JSON.stringify({ status: 200, usage, text }));
} catch (e) {
  if (!(e instanceof OpenAI.APIError)) throw e;
  console.log(JSON.stringify({ status: e.status, name: e.constructor.name }));
}
