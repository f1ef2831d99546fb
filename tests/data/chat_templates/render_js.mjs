// Renders chat-template cases with Hugging Face's JavaScript Jinja (@huggingface/jinja): reads
// [{source, variables}] on stdin, writes [{expected} | {error}] on stdout. Used by
// make_vectors.py at test-preparation time only.
import { createRequire } from "module";
import fs from "fs";

const require = createRequire(process.env.NODE_PATH + "/");
const { Template } = require("@huggingface/jinja");
const cases = JSON.parse(fs.readFileSync(0, "utf8"));
const out = cases.map(({ source, variables }) => {
  try {
    return { expected: new Template(source).render(variables) };
  } catch (e) {
    return { error: String(e.message) };
  }
});
process.stdout.write(JSON.stringify(out));
