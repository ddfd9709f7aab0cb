// Lesson 10's server through OpenAI's own Node client: every feature the server claims, as that
// client sends and reads it, streamed and not. A developer's check, not part of ./course test (it
// needs the npm registry): ./course openai-check starts a server and runs it.
//
//   node check.mjs http://127.0.0.1:PORT/v1 MODEL [API_KEY]
import OpenAI from "openai";

const [baseURL, model, apiKey = "none"] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60_000 });
let failed = 0;
const check = (what, ok, detail = "") => {
  console.log(`${ok ? "ok  " : "FAIL"} ${what}${ok ? "" : ": " + detail}`);
  if (!ok) failed++;
};
const streamed = async (stream) => {
  let text = "", reason = null, chunks = 0, usage = null;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.usage) usage = chunk.usage;
    const c = chunk.choices[0];
    if (!c) continue;
    text += c.text ?? c.delta?.content ?? "";
    if (c.finish_reason) reason = c.finish_reason;
  }
  return { text, reason, chunks, usage };
};
const refused = async (what, call, status, param) => {
  try {
    await call();
    check(what, false, "was served");
  } catch (e) {
    const ok = e instanceof OpenAI.APIError && e.status === status && (param === undefined || e.param === param);
    check(what, ok, `${e.status} ${e.param} ${e.message}`);
  }
};

// Models: list and retrieve (GET /v1/models/{id}), and an unknown id.
const models = await client.models.list();
check("models.list names the model", models.data.some((m) => m.id === model), JSON.stringify(models.data));
check("models.retrieve", (await client.models.retrieve(model)).id === model);
await refused("models.retrieve of an unknown model is a 404", () => client.models.retrieve("gpt-4"), 404);

// Completions, whole and streamed (greedy: the same text).
const prompt = "The secret of";
const whole = await client.completions.create({ model, prompt, max_tokens: 24, temperature: 0 });
check("completion: 24 tokens", whole.usage.completion_tokens === 24 && whole.choices[0].finish_reason === "length",
      JSON.stringify(whole));
const s = await streamed(await client.completions.create({ model, prompt, max_tokens: 24, temperature: 0, stream: true,
                                                          stream_options: { include_usage: true } }));
check("streamed completion equals the whole one", s.text === whole.choices[0].text, `${s.text} vs ${whole.choices[0].text}`);
check("stream_options.include_usage", s.usage?.completion_tokens === 24, JSON.stringify(s.usage));

// Stop sequences: the text ends before the first stop, finish_reason "stop", streamed or not.
const full = whole.choices[0].text;
const stop = full.slice(6, 9);
const cut = full.slice(0, full.indexOf(stop));
const stopped = await client.completions.create({ model, prompt, max_tokens: 24, temperature: 0, stop: [stop, "zzz"] });
check("stop (whole)", stopped.choices[0].text === cut && stopped.choices[0].finish_reason === "stop",
      JSON.stringify(stopped.choices[0]));
const stoppedStream = await streamed(await client.completions.create({ model, prompt, max_tokens: 24, temperature: 0,
                                                                      stop, stream: true }));
check("stop (streamed)", stoppedStream.text === cut && stoppedStream.reason === "stop", JSON.stringify(stoppedStream));

// Log-probabilities: completions logprobs N; chat logprobs + top_logprobs.
const lp = await client.completions.create({ model, prompt, max_tokens: 5, temperature: 0, logprobs: 3 });
const l = lp.choices[0].logprobs;
check("completion logprobs: one per token, 3 alternatives each",
      l.tokens.length === 5 && l.token_logprobs.every((x) => x <= 0) && l.top_logprobs.every((t) => Object.keys(t).length === 3),
      JSON.stringify(l));
const chatLp = await client.chat.completions.create({ model, max_tokens: 5, temperature: 0, logprobs: true, top_logprobs: 2,
                                                     messages: [{ role: "user", content: "Hello" }] });
const cl = chatLp.choices[0].logprobs.content;
check("chat logprobs with top_logprobs 2", cl.length === 5 && cl.every((t) => t.logprob <= 0 && t.top_logprobs.length === 2),
      JSON.stringify(chatLp.choices[0].logprobs));
await refused("top_logprobs 21 is refused by name", () => client.chat.completions.create({
  model, max_tokens: 5, logprobs: true, top_logprobs: 21, messages: [{ role: "user", content: "Hi" }] }), 400, "top_logprobs");

// Chat: content as text parts and the developer role, whole and streamed.
const messages = [
  { role: "developer", content: "Answer briefly." },
  { role: "user", content: [{ type: "text", text: "Tell me " }, { type: "text", text: "a fortune." }] },
];
const chat = await client.chat.completions.create({ model, messages, max_tokens: 20, temperature: 0 });
check("chat with text parts and a developer message", chat.choices[0].message.role === "assistant" &&
      chat.usage.completion_tokens > 0, JSON.stringify(chat));
const chatStream = await streamed(await client.chat.completions.create({ model, messages, max_tokens: 20, temperature: 0,
                                                                        stream: true }));
check("streamed chat equals the whole one", chatStream.text === chat.choices[0].message.content,
      `${chatStream.text} vs ${chat.choices[0].message.content}`);
await refused("an image part is refused by name", () => client.chat.completions.create({
  model, max_tokens: 5, messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: "x" } }] }] }),
  400, "messages");

// Bad values come back as the client's APIError, with the field named.
await refused("top_p 0", () => client.completions.create({ model, prompt, top_p: 0 }), 400, "top_p");
await refused("max_tokens -1", () => client.completions.create({ model, prompt, max_tokens: -1 }), 400, "max_tokens");
await refused("an unknown model", () => client.completions.create({ model: "gpt-4", prompt }), 404, "model");
await refused("logprobs with a stream", () => client.completions.create({ model, prompt, logprobs: 2, stream: true }),
              400, "logprobs");
// The key: with the server's --api-key, a wrong one is a 401 (the client's AuthenticationError).
const wrong = new OpenAI({ baseURL, apiKey: "wrong", maxRetries: 0 });
if (apiKey === "none") check("no key needed without --api-key", (await wrong.models.list()).data.length === 1);
else await refused("a wrong key is a 401", () => wrong.models.list(), 401);

console.log(failed === 0 ? "openai-check: every check passed" : `openai-check: ${failed} check(s) failed`);
process.exit(failed === 0 ? 0 : 1);
