// A two-tool agent loop through the official openai SDK (argv[2]: base URL; argv[3]: the call
// format): the model calls get_weather and add, gets their results, and answers. The model's
// outputs are forced (vLLM's guided_choice: the exact text a model of that family writes), so
// the check is Tandem's: each family's call format parsed into the tool_calls the SDK receives,
// streamed and not, the same; a streamed call's index, id and name first, then its arguments in
// fragments; reasoning in `reasoning_content` (and its own deltas), never in the content; the
// conversation (calls, results) rendered back through the template for the next turn.
// Prints one line per check; exits non-zero on any failure.
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.argv[2], apiKey: "none", maxRetries: 0 });
const format = process.argv[3];
const MODEL = (await client.models.list()).data[0].id;
const tools = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "Current weather of a city",
      parameters: {
        type: "object",
        properties: { city: { type: "string" }, unit: { enum: ["celsius", "fahrenheit"] } },
        required: ["city"],
      },
    },
  },
  {
    type: "function",
    function: {
      name: "add",
      description: "Adds two numbers",
      parameters: { type: "object", properties: { a: { type: "integer" }, b: { type: "integer" } } },
    },
  },
];
const weather = { city: "Paris", unit: "celsius" };
const sum = { a: 2, b: 3 };
const reasoning = "\nThe user wants two things: the weather and a sum. I will call both tools.\n";
// What a model of each family writes. One call per turn for Llama (its templates refuse
// several calls in one assistant message); both at once for the others.
const J = JSON.stringify;
const FORMATS = {
  hermes_thinking: {
    turns: [
      `<think>${reasoning}</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": ${J(weather)}}\n</tool_call>\n<tool_call>\n{"name": "add", "arguments": ${J(sum)}}\n</tool_call>`,
    ],
    reasoning: reasoning,
  },
  hermes: {
    turns: [
      `Let me look that up.\n<tool_call>\n{"name": "get_weather", "arguments": ${J(weather)}}\n</tool_call>\n<tool_call>\n{"name": "add", "arguments": ${J(sum)}}\n</tool_call>`,
    ],
    content: "Let me look that up.\n",
  },
  llama3_json: {
    turns: [
      `{"name": "get_weather", "parameters": ${J(weather)}}`,
      `{"name": "add", "parameters": ${J(sum)}}`,
    ],
  },
  pythonic: {
    turns: [`[get_weather(city="Paris", unit="celsius")]`, `[add(a=2, b=3)]`],
    compact: true,
  },
  mistral: {
    turns: [`[TOOL_CALLS][{"name": "get_weather", "arguments": ${J(weather)}}, {"name": "add", "arguments": ${J(sum)}}]`],
  },
  phi4_mini_json: {
    turns: [`functools[{"name": "get_weather", "arguments": ${J(weather)}}, {"name": "add", "arguments": ${J(sum)}}]`],
  },
  deepseek_v3: {
    turns: [
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n" + J(weather) +
        "\n```<｜tool▁call▁end｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n" + J(sum) +
        "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    ],
  },
};
const spec = FORMATS[format];
if (!spec) throw new Error(`unknown format ${format}`);
const ANSWER = "It is sunny in Paris, and 2 + 3 = 5.";

let failures = 0;
const fail = (what) => {
  failures++;
  console.log("FAIL " + what);
};
const expectedCalls = [
  ["get_weather", weather],
  ["add", sum],
];

function request(messages, forced, stream) {
  return {
    model: MODEL,
    messages,
    tools,
    tool_choice: "auto",
    max_tokens: 400,
    temperature: 0,
    stream,
    guided_choice: [forced],
  };
}

// Reads a stream into a message, checking the order of tool-call deltas.
async function readStream(stream, label) {
  const msg = { role: "assistant", content: "", reasoning_content: "", tool_calls: [] };
  let finish = null;
  const fragments = [];
  for await (const chunk of stream) {
    const choice = chunk.choices[0];
    if (!choice) continue;
    const d = choice.delta ?? {};
    if (d.reasoning_content) msg.reasoning_content += d.reasoning_content;
    if (d.content) msg.content += d.content;
    for (const tc of d.tool_calls ?? []) {
      if (tc.index === msg.tool_calls.length) {
        if (!tc.id || tc.type !== "function" || !tc.function?.name) {
          fail(`${label}: a call's first delta lacks its id, type or name: ${J(tc)}`);
        }
        if (tc.function?.arguments) fail(`${label}: arguments in the call's first delta`);
        msg.tool_calls.push({ id: tc.id, type: "function", function: { name: tc.function.name, arguments: "" } });
        fragments.push(0);
      } else if (tc.index < msg.tool_calls.length) {
        if (tc.id || tc.function?.name) fail(`${label}: id or name repeated in a later delta`);
        msg.tool_calls[tc.index].function.arguments += tc.function?.arguments ?? "";
        fragments[tc.index]++;
      } else {
        fail(`${label}: delta for call ${tc.index} before call ${msg.tool_calls.length}`);
      }
    }
    if (choice.finish_reason) finish = choice.finish_reason;
  }
  if (msg.tool_calls.length === 0) delete msg.tool_calls;
  return { msg, finish, fragments };
}

function checkCalls(label, msg, finish, want) {
  if (finish !== "tool_calls") return fail(`${label}: finish_reason ${finish}`);
  const calls = msg.tool_calls ?? [];
  if (calls.length !== want.length) return fail(`${label}: ${calls.length} calls, wanted ${want.length}`);
  want.forEach(([name, args], i) => {
    const c = calls[i];
    if (c.function.name !== name) fail(`${label}: call ${i} is ${c.function.name}`);
    let got;
    try {
      got = JSON.parse(c.function.arguments);
    } catch {
      return fail(`${label}: arguments not JSON: ${c.function.arguments}`);
    }
    // Key order as the model wrote it.
    if (J(got) !== J(args)) fail(`${label}: arguments ${c.function.arguments}, wanted ${J(args)}`);
    if (!c.id) fail(`${label}: call without id`);
  });
}

const messages = [
  { role: "system", content: "You can call tools." },
  { role: "user", content: "What is the weather in Paris, and what is 2 + 3?" },
];
let done = 0;
for (const [turn, forced] of spec.turns.entries()) {
  const want = spec.turns.length === 1 ? expectedCalls : [expectedCalls[turn]];
  const whole = await client.chat.completions.create(request(messages, forced, false));
  const m = whole.choices[0].message;
  checkCalls(`turn ${turn}`, m, whole.choices[0].finish_reason, want);
  const wantContent = spec.content ?? null;
  if ((m.content ?? null) !== wantContent) fail(`turn ${turn}: content ${J(m.content)}, wanted ${J(wantContent)}`);
  if (spec.reasoning !== undefined && m.reasoning_content !== spec.reasoning) {
    fail(`turn ${turn}: reasoning_content ${J(m.reasoning_content)}`);
  }
  const s = await readStream(await client.chat.completions.create(request(messages, forced, true)), `turn ${turn} streamed`);
  checkCalls(`turn ${turn} streamed`, s.msg, s.finish, want);
  // The same calls (ids differ: each is made from its own completion's id).
  if (J(s.msg.tool_calls?.map((c) => c.function)) !== J(m.tool_calls?.map((c) => c.function))) {
    fail(`turn ${turn}: streamed calls ${J(s.msg.tool_calls)} differ from ${J(m.tool_calls)}`);
  }
  if ((s.msg.content || null) !== wantContent) fail(`turn ${turn} streamed: content ${J(s.msg.content)}`);
  if (spec.reasoning !== undefined && s.msg.reasoning_content !== spec.reasoning) {
    fail(`turn ${turn} streamed: reasoning ${J(s.msg.reasoning_content)}`);
  }
  if (!spec.compact && !s.fragments.some((n) => n >= 2)) {
    fail(`turn ${turn} streamed: arguments came in one piece (${s.fragments}), not as they formed`);
  }
  console.log(`ok turn ${turn}: ${m.tool_calls.map((c) => c.function.name + c.function.arguments).join(" ")}; streamed in ${s.fragments} argument fragments`);
  messages.push(m);
  for (const c of m.tool_calls) {
    const args = JSON.parse(c.function.arguments);
    const result = c.function.name === "add" ? String(args.a + args.b) : "sunny, 21 C";
    messages.push({ role: "tool", tool_call_id: c.id, content: result });
  }
  done++;
}
const last = await client.chat.completions.create(request(messages, ANSWER, false));
if (last.choices[0].finish_reason !== "stop" || last.choices[0].message.content !== ANSWER || last.choices[0].message.tool_calls?.length) {
  fail(`answer: ${J(last.choices[0])}`);
} else {
  console.log(`ok answer after ${done} tool turns: ${J(last.choices[0].message.content)}`);
}
if (failures) {
  console.log(`${failures} failures`);
  process.exit(1);
}
