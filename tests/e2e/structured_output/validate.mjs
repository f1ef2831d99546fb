// Validates generated documents with Ajv (an independent JSON Schema implementation): reads
// [{schema, text}] on stdin, writes [{ok, error}] on stdout (text that is not JSON: ok false).
// Draft 2020-12 (prefixItems, $defs), the dialect the schema compiler follows.
import Ajv from "ajv/dist/2020.js";
import fs from "fs";

const cases = JSON.parse(fs.readFileSync(0, "utf8"));
const out = cases.map(({ schema, text }) => {
  let doc;
  try {
    doc = JSON.parse(text);
  } catch (e) {
    return { ok: false, error: "not JSON: " + e.message };
  }
  const ajv = new Ajv({ strict: false, allErrors: true });
  const validate = ajv.compile(schema);
  return validate(doc) ? { ok: true } : { ok: false, error: ajv.errorsText(validate.errors) };
});
process.stdout.write(JSON.stringify(out));
