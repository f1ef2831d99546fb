// Validates generated documents with Ajv (an independent JSON Schema implementation): reads
// [{schema, text, dialect}] on stdin, writes [{ok, error}] on stdout (text that is not JSON: ok false).
// Draft 2020-12 (prefixItems, $defs), the dialect the schema compiler follows; draft-07 for the
// JSON-Schema-Test-Suite's draft 6/7 schemas and draft-7 tuples (case.dialect "draft7"). Formats
// (date, time, date-time, uuid, email, ipv4, ...) are checked by ajv-formats.
import Ajv2020 from "ajv/dist/2020.js";
import Ajv from "ajv";
import addFormats from "ajv-formats";
import fs from "fs";

const cases = JSON.parse(fs.readFileSync(0, "utf8"));
const options = { strict: false, allErrors: true };
const ajvs = { draft7: addFormats(new Ajv(options)), draft2020: addFormats(new Ajv2020(options)) };
const compiled = new Map();
const out = cases.map(({ schema, text, dialect }) => {
  let doc;
  try {
    doc = JSON.parse(text);
  } catch (e) {
    return { ok: false, error: "not JSON: " + e.message };
  }
  const ajv = dialect === "draft7" ? ajvs.draft7 : ajvs.draft2020;
  const key = (dialect || "") + JSON.stringify(schema);
  let validate = compiled.get(key);
  if (!validate) {
    // A fresh instance when the schema's $id is taken by an earlier one.
    const fresh = () => addFormats(dialect === "draft7" ? new Ajv(options) : new Ajv2020(options));
    try {
      validate = ajv.compile(schema);
    } catch (e) {
      validate = fresh().compile(schema);
    }
    compiled.set(key, validate);
  }
  return validate(doc) ? { ok: true } : { ok: false, error: JSON.stringify(validate.errors) };
});
process.stdout.write(JSON.stringify(out));
