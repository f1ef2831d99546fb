#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace tandem {

// A small command-line parser for one subcommand: `--name=value`, `--name value` and bare
// `--flag` for booleans. Used by the commands' entry points, which register flags straight onto
// the fields of the Options structs their libraries take (so a default is written once).
class FlagSet {
 public:
  FlagSet(std::string command, std::string summary);

  void String(const char* name, std::string* value, const char* help);
  void Int(const char* name, int64_t* value, const char* help);
  void Int32(const char* name, int32_t* value, const char* help);
  void Double(const char* name, double* value, const char* help);
  void Float(const char* name, float* value, const char* help);
  void Bool(const char* name, bool* value, const char* help);
  // Repeatable string flag (each occurrence appends; `--name a b c` appends a, b and c: the
  // values run to the next argument that starts with '-').
  void StringList(const char* name, std::vector<std::string>* value, const char* help);

  // Parses argv[first..argc). On --help prints usage and sets help_requested().
  absl::Status Parse(int argc, char** argv, int first = 1);
  bool help_requested() const { return help_requested_; }
  // A command's Parse: errors go to stderr. Returns the exit code the command ends with (2: bad
  // flags; 0: --help was printed), or nullopt to go on.
  std::optional<int> ParseCommandLine(int argc, char** argv);
  std::string Usage() const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  enum class Kind { kString, kInt, kInt32, kDouble, kFloat, kBool, kStringList };
  struct Flag {
    std::string name;
    Kind kind;
    void* value;
    std::string help;
    std::string default_text;
  };
  void Add(const char* name, Kind kind, void* value, const char* help);
  absl::Status Set(Flag& flag, const std::string& text);

  std::string command_;
  std::string summary_;
  std::vector<Flag> flags_;
  std::vector<std::string> positional_;
  bool help_requested_ = false;
};

}  // namespace tandem
