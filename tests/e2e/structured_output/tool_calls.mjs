// Tool calling through the official openai SDK against a running Tandem HTTP API (argv[2]: base
// URL; argv[3] "quick": one seed instead of three). A chat with two tools; tool_choice required /
// named / auto, streaming and not; every call's arguments validated by Ajv against its
// function's parameter schema. Prints a summary
// and exits non-zero on any failure.
import Ajv from "ajv";
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.argv[2], apiKey: "none", maxRetries: 0 });
const MODEL = (await client.models.list()).data[0].id;
const tools = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "Current weather of a city",
      parameters: {
        type: "object",
        properties: {
          city: { type: "string", maxLength: 12 },
          unit: { enum: ["celsius", "fahrenheit"] },
        },
        required: ["city", "unit"],
        additionalProperties: false,
      },
    },
  },
  {
    type: "function",
    function: {
      name: "add",
      description: "Adds two small numbers",
      parameters: {
        type: "object",
        properties: { a: { type: "integer", minimum: 0 }, b: { enum: [1, 2, 3] } },
        required: ["a", "b"],
        additionalProperties: false,
      },
    },
  },
];
const ajv = new Ajv({ strict: false });
const validators = Object.fromEntries(
  tools.map((t) => [t.function.name, ajv.compile(t.function.parameters)]),
);
const messages = [
  { role: "system", content: "You can call tools." },
  { role: "user", content: "What is the weather in Paris, and what is 2 + 3?" },
];
let failures = 0;
const fail = (what) => {
  failures++;
  console.log("FAIL " + what);
};

function checkCalls(label, calls, finish, expectName, single) {
  if (finish !== "tool_calls") return fail(`${label}: finish_reason ${finish}`);
  if (!Array.isArray(calls) || calls.length === 0) return fail(`${label}: no tool_calls`);
  if (single && calls.length !== 1) fail(`${label}: ${calls.length} calls, wanted 1`);
  for (const c of calls) {
    if (c.type !== "function" || !c.id) fail(`${label}: malformed call ${JSON.stringify(c)}`);
    const v = validators[c.function.name];
    if (!v) return fail(`${label}: unknown function ${c.function.name}`);
    if (expectName && c.function.name !== expectName) fail(`${label}: called ${c.function.name}`);
    let args;
    try {
      args = JSON.parse(c.function.arguments);
    } catch (e) {
      return fail(`${label}: arguments not JSON: ${c.function.arguments}`);
    }
    if (!v(args)) fail(`${label}: arguments ${c.function.arguments}: ${ajv.errorsText(v.errors)}`);
  }
  console.log(`ok ${label}: ${calls.map((c) => c.function.name + c.function.arguments).join(" ")}`);
}

async function run(label, toolChoice, { stream, seed, parallel }) {
  const body = {
    model: MODEL,
    messages,
    tools,
    tool_choice: toolChoice,
    temperature: 1,
    seed,
    max_tokens: 400,
  };
  if (parallel !== undefined) body.parallel_tool_calls = parallel;
  if (!stream) {
    const r = await client.chat.completions.create(body);
    return { msg: r.choices[0].message, finish: r.choices[0].finish_reason };
  }
  const s = await client.chat.completions.create({ ...body, stream: true });
  const calls = [];
  let content = "";
  let finish = null;
  for await (const chunk of s) {
    const ch = chunk.choices[0];
    if (!ch) continue;
    if (ch.delta.content) content += ch.delta.content;
    for (const d of ch.delta.tool_calls ?? []) {
      calls[d.index] ??= { id: "", type: "function", function: { name: "", arguments: "" } };
      if (d.id) calls[d.index].id = d.id;
      if (d.function?.name) calls[d.index].function.name += d.function.name;
      if (d.function?.arguments) calls[d.index].function.arguments += d.function.arguments;
    }
    if (ch.finish_reason) finish = ch.finish_reason;
  }
  return { msg: { content, tool_calls: calls.length ? calls : undefined }, finish };
}

let lastCall;  // a call the server returned, sent back in the follow-up turn
// argv[3] "quick": one seed (the per-family runs of tool_call_formats_test.py).
const SEEDS = process.argv[3] === "quick" ? [1] : [1, 2, 3];
for (const stream of [false, true]) {
  for (const seed of SEEDS) {
    const tag = `${stream ? "stream" : "plain"} seed ${seed}`;
    let r = await run(`required ${tag}`, "required", { stream, seed });
    checkCalls(`required ${tag}`, r.msg.tool_calls, r.finish, null, false);
    r = await run(`required single ${tag}`, "required", { stream, seed, parallel: false });
    checkCalls(`required single ${tag}`, r.msg.tool_calls, r.finish, null, true);
    lastCall ??= r.msg.tool_calls?.[0];
    r = await run(`named ${tag}`, { type: "function", function: { name: "add" } }, { stream, seed });
    checkCalls(`named ${tag}`, r.msg.tool_calls, r.finish, "add", true);
    // auto: the model may answer in text; when it calls, the call must be valid.
    r = await run(`auto ${tag}`, "auto", { stream, seed });
    if (r.msg.tool_calls) {
      checkCalls(`auto ${tag}`, r.msg.tool_calls, r.finish, null, false);
    } else if (typeof r.msg.content !== "string") {
      fail(`auto ${tag}: neither text nor tool calls`);
    } else {
      console.log(`ok auto ${tag}: text answer (${r.finish})`);
    }
  }
}
// A follow-up turn carrying the assistant's tool call (as the server returned it: its id is
// what the model family's template expects, e.g. 9 characters for Mistral) and the tool's
// result is accepted.
const call = lastCall ?? {
  id: "call_1",
  type: "function",
  function: { name: "add", arguments: '{"a":2,"b":3}' },
};
const follow = await client.chat.completions.create({
  model: MODEL,
  messages: [
    ...messages,
    { role: "assistant", content: null, tool_calls: [call] },
    { role: "tool", tool_call_id: call.id, content: "5" },
  ],
  tools,
  max_tokens: 8,
});
if (typeof follow.choices[0].message.content !== "string") fail("follow-up turn");
else console.log("ok follow-up turn with a tool result");
// Errors: an unknown named tool and a bad parameter schema are 400s.
for (const [label, extra] of [
  ["unknown tool", { tool_choice: { type: "function", function: { name: "nope" } } }],
  ["bad schema", { tools: [{ type: "function", function: { name: "f", parameters: { type: "object", not: {} } } }], tool_choice: "required" }],
]) {
  try {
    await client.chat.completions.create({ model: MODEL, messages, tools, max_tokens: 4, ...extra });
    fail(`${label}: accepted`);
  } catch (e) {
    if (e.status !== 400) fail(`${label}: status ${e.status}`);
    else console.log(`ok ${label}: 400 ${e.message.slice(0, 80)}`);
  }
}
if (failures) {
  console.log(`${failures} failures`);
  process.exit(1);
}
console.log("all tool-calling checks passed");
