// Drives Anthropic's official SDK through Tollgate for sdk_test.go:
//   node anthropic.mjs <baseURL> <create|stream> <answer> <max_tokens>
// The X-Answer header names the test upstream's canned answer. Prints one
// JSON line: {"status":200,"usage":{...}} or {"status":429,...}.
import Anthropic from '@anthropic-ai/sdk';

const [, , baseURL, mode, answer, maxTokens] = process.argv;
const client = new Anthropic({
  apiKey: 'sdk-key',
  baseURL,
  maxRetries: 0,
  defaultHeaders: { 'X-Answer': answer },
});
const params = {
  model: 'claude-haiku-4',
  max_tokens: Number(maxTokens),
  messages: [{ role: 'user', content: 'hi' }],
};
try {
  const msg = mode === 'stream'
    ? await client.messages.stream(params).finalMessage()
    : await client.messages.create(params);
  console.log(JSON.stringify({ status: 200, usage: msg.usage, text: msg.content.map((b) => b.text).join('') }));
} catch (e) {
  if (!(e instanceof Anthropic.APIError)) throw e;
  console.log(JSON.stringify({ status: e.status, name: e.constructor.name }));
}
