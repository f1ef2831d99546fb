#include "common/base/flags.h"

#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tandem {

FlagSet::FlagSet(std::string command, std::string summary)
    : command_(std::move(command)), summary_(std::move(summary)) {}

void FlagSet::Add(const char* name, Kind kind, void* value, const char* help) {
  Flag f{name, kind, value, help, ""};
  switch (kind) {
    case Kind::kString:
      f.default_text = *static_cast<std::string*>(value);
      break;
    case Kind::kInt:
      f.default_text = std::to_string(*static_cast<int64_t*>(value));
      break;
    case Kind::kInt32:
      f.default_text = std::to_string(*static_cast<int32_t*>(value));
      break;
    case Kind::kDouble:
      f.default_text = absl::StrCat(*static_cast<double*>(value));
      break;
    case Kind::kFloat:
      f.default_text = absl::StrCat(*static_cast<float*>(value));
      break;
    case Kind::kBool:
      f.default_text = *static_cast<bool*>(value) ? "true" : "false";
      break;
    case Kind::kStringList:
      break;
  }
  flags_.push_back(std::move(f));
}

void FlagSet::String(const char* n, std::string* v, const char* h) { Add(n, Kind::kString, v, h); }
void FlagSet::Int(const char* n, int64_t* v, const char* h) { Add(n, Kind::kInt, v, h); }
void FlagSet::Int32(const char* n, int32_t* v, const char* h) { Add(n, Kind::kInt32, v, h); }
void FlagSet::Double(const char* n, double* v, const char* h) { Add(n, Kind::kDouble, v, h); }
void FlagSet::Float(const char* n, float* v, const char* h) { Add(n, Kind::kFloat, v, h); }
void FlagSet::Bool(const char* n, bool* v, const char* h) { Add(n, Kind::kBool, v, h); }
void FlagSet::StringList(const char* n, std::vector<std::string>* v, const char* h) {
  Add(n, Kind::kStringList, v, h);
}

absl::Status FlagSet::Set(Flag& f, const std::string& text) {
  auto bad = [&]() {
    return absl::InvalidArgumentError(absl::StrCat("--", f.name, ": invalid value '", text, "'"));
  };
  switch (f.kind) {
    case Kind::kString:
      *static_cast<std::string*>(f.value) = text;
      return absl::OkStatus();
    case Kind::kStringList:
      static_cast<std::vector<std::string>*>(f.value)->push_back(text);
      return absl::OkStatus();
    case Kind::kInt:
      if (!absl::SimpleAtoi(text, static_cast<int64_t*>(f.value))) return bad();
      return absl::OkStatus();
    case Kind::kInt32:
      if (!absl::SimpleAtoi(text, static_cast<int32_t*>(f.value))) return bad();
      return absl::OkStatus();
    case Kind::kDouble:
      if (!absl::SimpleAtod(text, static_cast<double*>(f.value))) return bad();
      return absl::OkStatus();
    case Kind::kFloat:
      if (!absl::SimpleAtof(text, static_cast<float*>(f.value))) return bad();
      return absl::OkStatus();
    case Kind::kBool:
      if (!absl::SimpleAtob(text, static_cast<bool*>(f.value))) return bad();
      return absl::OkStatus();
  }
  return bad();
}

absl::Status FlagSet::Parse(int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      help_requested_ = true;
      std::fputs(Usage().c_str(), stdout);
      return absl::OkStatus();
    }
    if (arg.rfind("--", 0) != 0) {
      positional_.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    for (char& c : name) {
      if (c == '_') c = '-';
    }
    Flag* flag = nullptr;
    for (Flag& f : flags_) {
      if (f.name == name) flag = &f;
    }
    bool negated = false;
    if (flag == nullptr && name.rfind("no-", 0) == 0) {
      for (Flag& f : flags_) {
        if (f.kind == Kind::kBool && f.name == name.substr(3)) flag = &f;
      }
      negated = flag != nullptr;
    }
    if (flag == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", name, " for '", command_, "' (see --help)"));
    }
    if (flag->kind == Kind::kBool && !has_value) {
      *static_cast<bool*>(flag->value) = !negated;
      continue;
    }
    if (!has_value) {
      if (i + 1 >= argc)
        return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      value = argv[++i];
      // A list given as separate arguments (--flag a b c, argparse's nargs='+', as vLLM's
      // --lora-modules): the values run to the next argument that starts with '-'.
      while (flag->kind == Kind::kStringList && i + 1 < argc && argv[i + 1][0] != '-') {
        if (auto st = Set(*flag, value); !st.ok()) return st;
        value = argv[++i];
      }
    }
    if (auto st = Set(*flag, value); !st.ok()) return st;
  }
  return absl::OkStatus();
}

std::optional<int> FlagSet::ParseCommandLine(int argc, char** argv) {
  if (absl::Status st = Parse(argc, argv); !st.ok()) {
    std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
    return 2;
  }
  if (help_requested_) return 0;
  return std::nullopt;
}

std::string FlagSet::Usage() const {
  std::string out =
      absl::StrCat("Usage: tandem ", command_, " [flags]\n\n", summary_, "\n\nFlags:\n");
  for (const Flag& f : flags_) {
    std::string line = absl::StrCat("  --", f.name);
    if (line.size() < 30)
      line.resize(30, ' ');
    else
      line += " ";
    absl::StrAppend(&out, line, f.help);
    if (!f.default_text.empty()) absl::StrAppend(&out, " (default: ", f.default_text, ")");
    absl::StrAppend(&out, "\n");
  }
  return out;
}

}  // namespace tandem
