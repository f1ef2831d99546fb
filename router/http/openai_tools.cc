#include "router/http/openai_tools.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/grammar/json_schema.h"
#include "common/grammar/regex_to_grammar.h"
#include "router/http/request_error.h"

namespace tandem {
namespace {

using Json = nlohmann::ordered_json;

std::string SchemaText(const Json& schema) { return schema.dump(); }

}  // namespace

ToolCallFormat ToolCallFormatOf(ToolCallParser parser) {
  switch (parser) {
    case ToolCallParser::kHermes:
      return ToolCallFormat::kHermes;
    case ToolCallParser::kLlama3Json:
    case ToolCallParser::kPythonic:
      return ToolCallFormat::kLlama;
    default:
      return ToolCallFormat::kJsonArray;
  }
}

ToolCallParser RequiredOutputParser(ToolCallFormat format, ToolCallParser family) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return ToolCallParser::kHermes;
    case ToolCallFormat::kLlama:
      return ToolCallParser::kLlama3Json;
    case ToolCallFormat::kJsonArray:
      return family == ToolCallParser::kMistral ? family : ToolCallParser::kJson;
  }
  return ToolCallParser::kJson;
}

ToolCallFormat ToolCallFormatOfTemplate(std::string_view source) {
  switch (ToolCallParserOfTemplate(source)) {
    case ToolCallParser::kQwen3Coder:  // tagged formats: "required" writes the generic array
    case ToolCallParser::kGlm45:
    case ToolCallParser::kMinimaxM2:
    case ToolCallParser::kKimiK2:
      return ToolCallFormat::kJsonArray;
    default:
      break;
  }
  if (source.find("<tool_call>") != std::string_view::npos) return ToolCallFormat::kHermes;
  if (source.find("[TOOL_CALLS]") != std::string_view::npos) return ToolCallFormat::kJsonArray;
  if (source.find("<|start_header_id|>") != std::string_view::npos &&
      source.find("\"parameters\"") != std::string_view::npos) {
    return ToolCallFormat::kLlama;
  }
  return ToolCallFormat::kJsonArray;
}

bool MistralCallIds(std::string_view source) {
  return source.find("[TOOL_CALLS]") != std::string_view::npos;
}

absl::StatusOr<ToolCallOptions> ParseToolOptions(const Json& body) {
  ToolCallOptions out;
  if (auto it = body.find("functions"); it != body.end() && !it->is_null()) {
    return InvalidField("functions", "deprecated; use tools");
  }
  auto tools = body.find("tools");
  const bool has_tools = tools != body.end() && !tools->is_null();
  if (has_tools) {
    if (!tools->is_array()) return InvalidField("tools", "must be a list");
    if (tools->size() > 128) return InvalidField("tools", "at most 128");
    std::set<std::string> names;
    for (size_t i = 0; i < tools->size(); ++i) {
      const Json& t = (*tools)[i];
      const std::string field = absl::StrCat("tools[", i, "]");
      if (!t.is_object() || t.value("type", Json()) != Json("function")) {
        return InvalidField(field + ".type", "only \"function\" tools are supported");
      }
      auto fn = t.find("function");
      if (fn == t.end() || !fn->is_object())
        return InvalidField(field + ".function", "is required");
      auto name = fn->find("name");
      if (name == fn->end() || !name->is_string() || name->get<std::string>().empty()) {
        return InvalidField(field + ".function.name", "must be a non-empty string");
      }
      ToolCallOptions::Tool tool;
      tool.name = name->get<std::string>();
      if (!names.insert(tool.name).second) {
        return InvalidField(field + ".function.name",
                            absl::StrCat("'", tool.name, "' given twice"));
      }
      tool.parameters = Json::object();
      if (auto p = fn->find("parameters"); p != fn->end() && !p->is_null()) {
        if (!p->is_object())
          return InvalidField(field + ".function.parameters", "must be an object");
        tool.parameters = *p;
      }
      out.tools.push_back(std::move(tool));
    }
  }
  if (auto it = body.find("parallel_tool_calls"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean()) return InvalidField("parallel_tool_calls", "must be true or false");
    out.parallel = it->get<bool>();
  }
  auto choice = body.find("tool_choice");
  const bool has_choice = choice != body.end() && !choice->is_null();
  if (out.tools.empty()) {
    if (has_choice && !(choice->is_string() && choice->get<std::string>() == "none")) {
      return InvalidField("tool_choice", "requires tools");
    }
    return out;
  }
  out.choice = ToolCallOptions::Choice::kAuto;  // OpenAI's default with tools
  if (!has_choice) return out;
  if (choice->is_string()) {
    const std::string c = choice->get<std::string>();
    if (c == "none") {
      out.choice = ToolCallOptions::Choice::kNone;
    } else if (c == "auto") {
      out.choice = ToolCallOptions::Choice::kAuto;
    } else if (c == "required") {
      out.choice = ToolCallOptions::Choice::kRequired;
    } else {
      return InvalidField("tool_choice",
                          "must be \"none\", \"auto\", \"required\" or a named function");
    }
    return out;
  }
  if (!choice->is_object() || choice->value("type", Json()) != Json("function") ||
      !choice->contains("function") || !(*choice)["function"].is_object() ||
      !(*choice)["function"].value("name", Json()).is_string()) {
    return InvalidField("tool_choice",
                        "a named choice is {\"type\": \"function\", \"function\": "
                        "{\"name\": ...}}");
  }
  out.named = (*choice)["function"]["name"].get<std::string>();
  bool found = false;
  for (const auto& t : out.tools) found = found || t.name == out.named;
  if (!found) return InvalidField("tool_choice", absl::StrCat("no tool named '", out.named, "'"));
  out.choice = ToolCallOptions::Choice::kNamed;
  return out;
}

absl::StatusOr<std::string> RequiredToolCallGrammar(const ToolCallOptions& tools) {
  std::string rules;
  std::string call = "call ::= \"{\\\"name\\\":\" ( ";
  for (size_t i = 0; i < tools.tools.size(); ++i) {
    const auto& t = tools.tools[i];
    grammar::JsonSchemaOptions o;
    o.prefix = absl::StrCat("t", i, "-");
    o.include_base_rules = false;
    auto g = grammar::JsonSchemaToGrammar(SchemaText(t.parameters), o);
    if (!g.ok()) {
      return InvalidField(absl::StrCat("tools[", i, "].function.parameters"),
                          std::string(g.status().message()));
    }
    absl::StrAppend(&rules, *g);
    absl::StrAppend(&call, i ? " | " : "", grammar::GrammarLiteral(Json(t.name).dump()),
                    " \",\\\"arguments\\\":\" ", o.prefix, "root");
  }
  absl::StrAppend(&call, " ) \"}\"\n");
  // Parallel calls are bounded so a turn always ends: at most max(4, number of tools).
  const size_t max_calls = tools.parallel ? std::max<size_t>(4, tools.tools.size()) : 1;
  std::string root;
  switch (tools.format) {
    case ToolCallFormat::kJsonArray:
      root = max_calls == 1 ? "root ::= \"[\" call \"]\"\n"
                            : absl::StrCat("root ::= \"[\" call ( \",\" call ){0,", max_calls - 1,
                                           "} \"]\"\n");
      break;
    case ToolCallFormat::kHermes:
      root = max_calls == 1
                 ? "root ::= block\n"
                 : absl::StrCat("root ::= block ( \"\\n\" block ){0,", max_calls - 1, "}\n");
      absl::StrAppend(&root, "block ::= \"<tool_call>\\n\" call \"\\n</tool_call>\"\n");
      break;
    case ToolCallFormat::kLlama:
      // One call per turn, its arguments under "parameters".
      root = "root ::= call\n";
      absl::StrReplaceAll({{"\\\"arguments\\\"", "\\\"parameters\\\""}}, &call);
      break;
  }
  return absl::StrCat(root, call, rules, grammar::JsonBaseRules());
}

absl::Status ConvertOutputConstraint(const Json& body, const ToolCallOptions& tools,
                                     v1::OutputConstraint* c) {
  int set = 0;
  auto once = [&](const char* field) -> absl::Status {
    if (++set > 1) {
      return InvalidField(field,
                          "only one of response_format, guided_json, guided_regex, "
                          "guided_grammar, guided_choice and a forced tool_choice may be given");
    }
    return absl::OkStatus();
  };
  if (auto it = body.find("response_format"); it != body.end() && !it->is_null()) {
    if (!it->is_object() || !it->value("type", Json()).is_string()) {
      return InvalidField("response_format", "must be an object with a type");
    }
    const std::string type = (*it)["type"].get<std::string>();
    if (type == "json_object") {
      if (auto st = once("response_format"); !st.ok()) return st;
      c->set_json_object(true);
    } else if (type == "json_schema") {
      auto js = it->find("json_schema");
      if (js == it->end() || !js->is_object()) {
        return InvalidField("response_format.json_schema", "is required with type json_schema");
      }
      auto schema = js->find("schema");
      if (schema == js->end() || !(schema->is_object() || schema->is_boolean())) {
        return InvalidField("response_format.json_schema.schema", "must be a JSON Schema object");
      }
      if (auto st = once("response_format"); !st.ok()) return st;
      c->set_json_schema(SchemaText(*schema));
      bool strict = false;  // OpenAI's default
      if (auto s = js->find("strict"); s != js->end() && !s->is_null()) {
        if (!s->is_boolean())
          return InvalidField("response_format.json_schema.strict", "must be a bool");
        strict = s->get<bool>();
      }
      c->set_strict(strict);
    } else if (type != "text") {
      return InvalidField("response_format.type",
                          "must be \"text\", \"json_object\" or \"json_schema\"");
    }
  }
  if (auto it = body.find("guided_json"); it != body.end() && !it->is_null()) {
    if (auto st = once("guided_json"); !st.ok()) return st;
    if (it->is_string()) {
      c->set_json_schema(it->get<std::string>());
    } else if (it->is_object() || it->is_boolean()) {
      c->set_json_schema(SchemaText(*it));
    } else {
      return InvalidField("guided_json", "must be a JSON Schema (object, boolean or string)");
    }
  }
  for (const char* field : {"guided_regex", "guided_grammar"}) {
    auto it = body.find(field);
    if (it == body.end() || it->is_null()) continue;
    if (!it->is_string()) return InvalidField(field, "must be a string");
    if (auto st = once(field); !st.ok()) return st;
    if (std::string(field) == "guided_regex") {
      c->set_regex(it->get<std::string>());
    } else {
      c->set_grammar(it->get<std::string>());
    }
  }
  if (auto it = body.find("guided_choice"); it != body.end() && !it->is_null()) {
    if (!it->is_array() || it->empty())
      return InvalidField("guided_choice", "must be a list of strings");
    if (auto st = once("guided_choice"); !st.ok()) return st;
    for (const Json& s : *it) {
      if (!s.is_string() || s.get<std::string>().empty()) {
        return InvalidField("guided_choice", "must be a list of non-empty strings");
      }
      c->mutable_choice()->add_choices(s.get<std::string>());
    }
  }
  if (tools.choice == ToolCallOptions::Choice::kRequired) {
    if (auto st = once("tool_choice"); !st.ok()) return st;
    auto g = RequiredToolCallGrammar(tools);
    if (!g.ok()) return g.status();
    c->set_grammar(*g);
  } else if (tools.choice == ToolCallOptions::Choice::kNamed) {
    if (auto st = once("tool_choice"); !st.ok()) return st;
    for (const auto& t : tools.tools) {
      if (t.name == tools.named) c->set_json_schema(SchemaText(t.parameters));
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem
