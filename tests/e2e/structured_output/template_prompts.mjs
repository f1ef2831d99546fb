// The prompt Tandem builds from OpenAI chat requests, compared through the HTTP API with the
// one Hugging Face's JavaScript Jinja (@huggingface/jinja) renders from the same chat template:
// plain turns, tools, a tool call and its result, parallel calls, continue_final_message,
// add_generation_prompt false and chat_template_kwargs. Tandem's side is the prompt of a real
// chat completion (vLLM's return_token_ids: `prompt_token_ids`); the reference text is turned
// into ids by Tandem's POST /tokenize (same tokenizer), so equal ids mean the same prompt.
// argv: base URL (…/v1), template file, bos token, eos token, and a mode: "always-tools" for
// templates written for tool use only (Hermes' tool_use template loops over `tools`, which
// Python's Jinja allows undefined and @huggingface/jinja does not); "string-arguments" for
// templates that add a call's arguments to a string (DeepSeek V3.1): given the object arguments
// transformers and vLLM pass, Python's Jinja refuses that (a TypeError) where
// @huggingface/jinja converts, so Tandem must refuse those cases as Python does. Prints one line
// per case and exits non-zero on any difference.
import fs from "fs";
import { Template } from "@huggingface/jinja";

const [base, templateFile, bos, eos, mode] = process.argv.slice(2);
const source = fs.readFileSync(templateFile, "utf8");
const root = base.replace(/\/v1$/, "");
const model = (await (await fetch(`${base}/models`)).json()).data[0].id;

// Keys deliberately not in alphabetical order: the template must print them as sent.
const tools = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "Current weather in a city.",
      parameters: {
        type: "object",
        properties: {
          unit: { type: "string", description: "Unit", enum: ["celsius", "fahrenheit"] },
          city: { type: "string", description: "City name" },
        },
        required: ["city"],
      },
    },
  },
  {
    type: "function",
    function: {
      name: "add",
      description: "Adds two numbers.",
      parameters: {
        type: "object",
        properties: { b: { type: "integer", description: "Second" }, a: { type: "integer", description: "First" } },
      },
    },
  },
];
const call = (id, name, args) => ({ id, type: "function", function: { name, arguments: args } });
const user = (content) => ({ role: "user", content });
const kwargs = { date_string: "26 Jul 2024" }; // templates that print today's date
const cases = [
  { name: "system and user", messages: [{ role: "system", content: "Be brief." }, user("Hi!")] },
  { name: "tools", messages: [user("Weather in Paris?")], tools },
  {
    name: "call and result",
    tools,
    messages: [
      user("Weather in Paris?"),
      { role: "assistant", content: null, tool_calls: [call("abcDEF123", "get_weather", '{"unit": "celsius", "city": "Paris"}')] },
      { role: "tool", tool_call_id: "abcDEF123", content: '{"temp": 21}' },
    ],
  },
  {
    name: "parallel calls",
    tools,
    messages: [
      user("Weather in Paris, and 2 + 3?"),
      {
        role: "assistant",
        content: "",
        tool_calls: [call("abcDEF123", "get_weather", '{"city": "Paris"}'), call("xyzXYZ789", "add", '{"b": 3, "a": 2}')],
      },
      { role: "tool", tool_call_id: "abcDEF123", content: "sunny" },
      { role: "tool", tool_call_id: "xyzXYZ789", content: "5" },
    ],
  },
  {
    name: "continue_final_message",
    messages: [user("Count to three."), { role: "assistant", content: "One, two," }],
    add_generation_prompt: false,
    continue_final_message: true,
  },
  {
    name: "no generation prompt",
    messages: [user("Hi"), { role: "assistant", content: "Hello." }],
    add_generation_prompt: false,
  },
];
if (mode === "always-tools") for (const c of cases) c.tools = tools;
if (source.includes("enable_thinking")) {
  cases.push({ name: "enable_thinking false", messages: [user("Hi")], template_kwargs: { enable_thinking: false } });
}
if (/\bthinking\b/.test(source) && !source.includes("enable_thinking")) {
  cases.push({ name: "thinking true", messages: [user("Hi")], template_kwargs: { thinking: true } });
}

// The messages as Hugging Face templates get them from vLLM: content null/absent as "",
// tool-call arguments parsed into objects (their keys in order).
function templateMessages(messages) {
  return messages.map((m) => {
    const out = { ...m };
    if (out.content === null || out.content === undefined) out.content = "";
    if (out.tool_calls) {
      out.tool_calls = out.tool_calls.map((c) => ({
        ...c,
        function: { ...c.function, arguments: JSON.parse(c.function.arguments) },
      }));
    }
    return out;
  });
}

// transformers' apply_chat_template with continue_final_message.
function continueFinal(rendered, finalText) {
  const strip = (s) => s.replace(/^\s+|\s+$/g, "");
  const lstrip = (s) => s.replace(/^\s+/, "");
  const loc = rendered.lastIndexOf(strip(finalText));
  if (loc < 0) throw new Error("the final message does not appear in the rendered chat");
  if (rendered.slice(loc, loc + lstrip(finalText).length) === finalText) {
    return rendered.slice(0, loc + lstrip(finalText).length);
  }
  return rendered.slice(0, loc + strip(finalText).length);
}

async function post(path, body) {
  const r = await fetch(`${root}${path}`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
  return { status: r.status, body: await r.json() };
}

let failures = 0;
for (const c of cases) {
  const addGen = c.add_generation_prompt ?? true;
  let reference = null;
  let refError = null;
  try {
    const vars = { ...kwargs, ...(c.template_kwargs ?? {}), messages: templateMessages(c.messages) };
    vars.add_generation_prompt = addGen;
    vars.bos_token = bos;
    vars.eos_token = eos;
    if (c.tools) vars.tools = c.tools;
    reference = new Template(source).render(vars);
    if (c.continue_final_message) reference = continueFinal(reference, c.messages.at(-1).content);
  } catch (e) {
    refError = String(e.message);
  }
  const body = {
    model,
    messages: c.messages,
    max_tokens: 1,
    temperature: 0,
    return_token_ids: true,
    chat_template_kwargs: { ...kwargs, ...(c.template_kwargs ?? {}) },
    add_generation_prompt: addGen,
  };
  if (c.tools) body.tools = c.tools;
  if (c.continue_final_message) body.continue_final_message = true;
  const got = await post("/v1/chat/completions", body);
  const callHistory = c.messages.some((m) => m.tool_calls);
  if (mode === "string-arguments" && callHistory) {
    if (got.status === 400 && /unsupported operand/.test(got.body.error?.message ?? "")) {
      console.log(`ok ${c.name}: refused as Python's Jinja refuses str + dict arguments`);
    } else {
      failures++;
      console.log(`FAIL ${c.name}: ${got.status} ${JSON.stringify(got.body).slice(0, 200)}`);
    }
    continue;
  }
  if (refError !== null) {
    if (got.status === 400) {
      console.log(`ok ${c.name}: the template refuses it, as the reference does (${refError.slice(0, 60)})`);
    } else {
      failures++;
      console.log(`FAIL ${c.name}: the reference fails (${refError}) but Tandem answered ${got.status}`);
    }
    continue;
  }
  if (got.status !== 200) {
    failures++;
    console.log(`FAIL ${c.name}: ${got.status} ${JSON.stringify(got.body).slice(0, 300)}`);
    continue;
  }
  const ref = await post("/tokenize", { model, prompt: reference, add_special_tokens: false });
  const want = ref.body.tokens;
  const have = got.body.prompt_token_ids;
  if (ref.status !== 200 || !Array.isArray(have) || JSON.stringify(want) !== JSON.stringify(have)) {
    failures++;
    let at = 0;
    while (have && want && at < Math.min(have.length, want.length) && have[at] === want[at]) at++;
    console.log(`FAIL ${c.name}: prompt ids differ at ${at} (${have?.length} vs ${want?.length}); reference text: ${JSON.stringify(reference).slice(0, 400)}`);
    continue;
  }
  console.log(`ok ${c.name}: ${have.length} prompt tokens identical`);
}
if (failures) {
  console.log(`${failures} failures`);
  process.exit(1);
}
