// Drives Google's official Gen AI SDK (Gemini API) through Tollgate for
// sdk_test.go:
//   node gemini.mjs <baseURL> <generate|stream> <answer> <max output tokens>
// The X-Answer header names the test upstream's canned answer. Prints one
// JSON line: {"status":200,"usage":{...},"text":"..."} or {"status":429,...}.
import { GoogleGenAI, ApiError } from '@google/genai';

const [, , baseUrl, mode, answer, maxTokens] = process.argv;
const ai = new GoogleGenAI({
  apiKey: 'sdk-key',
  httpOptions: { baseUrl, headers: { 'X-Answer': answer } },
});
const params = {
  model: 'gemini-2.5-flash',
  contents: 'hi',
  config: { maxOutputTokens: Number(maxTokens) },
};
try {
  let usage = null;
  let text = '';
  if (mode === 'stream') {
    for await (const chunk of await ai.models.generateContentStream(params)) {
      text += chunk.text ?? '';
      if (chunk.usageMetadata) usage = chunk.usageMetadata;
    }
  } else {
    const r = await ai.models.generateContent(params);
    usage = r.usageMetadata;
    text = r.text;
  }
  console.log(JSON.stringify({ status: 200, usage, text }));
} catch (e) {
  if (!(e instanceof ApiError)) throw e;
  console.log(JSON.stringify({ status: e.status, name: e.name }));
}
