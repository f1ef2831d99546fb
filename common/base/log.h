#pragma once

#include <sstream>
#include <string>

namespace tandem {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kFatal = 4 };

struct LogOptions {
  LogLevel min_level = LogLevel::kInfo;
  bool json = false;      // one JSON object per line instead of text
  std::string component;  // e.g. "router", "decode"; printed on every line
};

// Process-wide logging configuration; set once from main.
void ConfigureLogging(const LogOptions& options);
const LogOptions& GetLogOptions();
bool LogEnabled(LogLevel level);

// One log line, written to stderr atomically when destroyed. kFatal aborts afterwards.
class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;

  // Attach a structured field (printed as key=value, or as a JSON member).
  LogMessage& Field(const std::string& key, const std::string& value);
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  const char* file_;
  int line_;
  std::ostringstream stream_;
  std::string fields_json_;
  std::string fields_text_;
};

// Usage: TLOG(INFO) << "model loaded in " << ms << " ms";
#define TLOG(severity) TANDEM_LOG_##severity
#define TANDEM_LOG_AT_(lvl)         \
  if (!::tandem::LogEnabled(lvl)) { \
  } else                            \
    ::tandem::LogMessage(lvl, __FILE__, __LINE__).stream()
#define TANDEM_LOG_DEBUG TANDEM_LOG_AT_(::tandem::LogLevel::kDebug)
#define TANDEM_LOG_INFO TANDEM_LOG_AT_(::tandem::LogLevel::kInfo)
#define TANDEM_LOG_WARNING TANDEM_LOG_AT_(::tandem::LogLevel::kWarning)
#define TANDEM_LOG_ERROR TANDEM_LOG_AT_(::tandem::LogLevel::kError)
#define TANDEM_LOG_FATAL TANDEM_LOG_AT_(::tandem::LogLevel::kFatal)

// Invariant check that survives release builds.
#define TANDEM_CHECK(cond)                                                        \
  if (cond) {                                                                     \
  } else                                                                          \
    ::tandem::LogMessage(::tandem::LogLevel::kFatal, __FILE__, __LINE__).stream() \
        << "check failed: " #cond " "

}  // namespace tandem
