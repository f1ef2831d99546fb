// Validates generated documents with Ajv (an independent JSON Schema implementation): reads
// [{schema, text, dialect}] on stdin, writes [{ok, error}] on stdout (text that is not JSON: ok false).
// Draft 2020-12 (prefixItems, $defs), the dialect the schema compiler follows; draft-07 for the
// JSON-Schema-Test-Suite's draft 6/7 schemas (case.dialect "draft7").
import Ajv2020 from "ajv/dist/2020.js";
import Ajv from "ajv";
import fs from "fs";

const cases = JSON.parse(fs.readFileSync(0, "utf8"));
const out = cases.map(({ schema, text, dialect }) => {
  let doc;
  try {
    doc = JSON.parse(text);
  } catch (e) {
    return { ok: false, error: "not JSON: " + e.message };
  }
  const options = { strict: false, allErrors: true, validateFormats: false };
  const ajv = dialect === "draft7" ? new Ajv(options) : new Ajv2020(options);
  const validate = ajv.compile(schema);
  return validate(doc) ? { ok: true } : { ok: false, error: ajv.errorsText(validate.errors) };
});
process.stdout.write(JSON.stringify(out));
