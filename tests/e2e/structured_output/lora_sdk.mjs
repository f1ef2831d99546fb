// LoRA adapters through the official openai SDK against a running Tandem HTTP API (argv: base
// URL, the name of an adapter loaded at start, the directory of another to load at runtime).
// Lists models (the adapter with its base as parent), runs completions and chat (plain and
// streamed) with `model` set to the adapter, loads the second adapter with POST
// /v1/load_lora_adapter, uses it, unloads it with /v1/unload_lora_adapter and sees it refused
// (404) afterwards. Exits non-zero on any failure.
import OpenAI from "openai";

const [baseURL, adapter, loadPath] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "none", maxRetries: 0 });
const fail = (message) => {
  console.error(`lora_sdk: ${message}`);
  process.exit(1);
};

const models = (await client.models.list()).data;
const base = models.find((m) => m.parent === null || m.parent === undefined);
const entry = models.find((m) => m.id === adapter);
if (!base || !entry || entry.parent !== base.id) {
  fail(`models.list: ${JSON.stringify(models)}`);
}

const prompt = "Once upon a time";
const complete = async (model) =>
  (await client.completions.create({ model, prompt, max_tokens: 12, temperature: 0 })).choices[0]
    .text;
const viaAdapter = await complete(adapter);
const viaBase = await complete(base.id);
if (viaAdapter === viaBase) fail(`the adapter changes nothing: ${JSON.stringify(viaAdapter)}`);

const messages = [{ role: "user", content: "Tell me a story about a cat." }];
const chat = await client.chat.completions.create({
  model: adapter,
  messages,
  max_tokens: 12,
  temperature: 0,
});
if (chat.model !== adapter) fail(`chat answered as ${chat.model}`);
let streamed = "";
const stream = await client.chat.completions.create({
  model: adapter,
  messages,
  max_tokens: 12,
  temperature: 0,
  stream: true,
});
for await (const chunk of stream) streamed += chunk.choices[0]?.delta?.content ?? "";
if (streamed !== chat.choices[0].message.content) {
  fail(`streamed chat ${JSON.stringify(streamed)} != ${JSON.stringify(chat.choices[0].message.content)}`);
}
const chatBase = await client.chat.completions.create({
  model: base.id,
  messages,
  max_tokens: 12,
  temperature: 0,
});
if (chatBase.choices[0].message.content === chat.choices[0].message.content) {
  fail("chat: the adapter changes nothing");
}

// Runtime loading, with the SDK's generic request methods (vLLM answers these with text).
const loaded = await client.post("/load_lora_adapter", {
  body: { lora_name: "sdk-loaded", lora_path: loadPath },
});
if (!String(loaded).includes("Success")) fail(`load: ${loaded}`);
const viaLoaded = await complete("sdk-loaded");
if (viaLoaded === viaBase || viaLoaded === viaAdapter) fail("the loaded adapter is not used");
if (!(await client.models.list()).data.some((m) => m.id === "sdk-loaded")) {
  fail("the loaded adapter is not listed");
}
await client.post("/unload_lora_adapter", { body: { lora_name: "sdk-loaded" } });
try {
  await complete("sdk-loaded");
  fail("an unloaded adapter still answers");
} catch (e) {
  if (!(e instanceof OpenAI.NotFoundError)) fail(`after unload: ${e}`);
}
console.log(
  `ok: openai SDK: models.list with parent, completions and chat (streamed too) with model=` +
    `${adapter}, load / use / unload of a runtime adapter`,
);
