#include "common/base/log.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <mutex>

#include "nlohmann/json.hpp"

namespace tandem {
namespace {

LogOptions& MutableOptions() {
  static LogOptions options;
  return options;
}

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "DEBUG";
    case LogLevel::kInfo:
      return "INFO";
    case LogLevel::kWarning:
      return "WARN";
    case LogLevel::kError:
      return "ERROR";
    case LogLevel::kFatal:
      return "FATAL";
  }
  return "?";
}

std::string Timestamp() {
  auto now = std::chrono::system_clock::now();
  std::time_t secs = std::chrono::system_clock::to_time_t(now);
  auto micros =
      std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() %
      1000000;
  std::tm tm;
  gmtime_r(&secs, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%06lldZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<long long>(micros));
  return buf;
}

const char* Basename(const char* path) {
  const char* base = path;
  for (const char* p = path; *p; ++p) {
    if (*p == '/') base = p + 1;
  }
  return base;
}

}  // namespace

void ConfigureLogging(const LogOptions& options) { MutableOptions() = options; }
const LogOptions& GetLogOptions() { return MutableOptions(); }
bool LogEnabled(LogLevel level) { return level >= MutableOptions().min_level; }

LogMessage::LogMessage(LogLevel level, const char* file, int line)
    : level_(level), file_(file), line_(line) {}

LogMessage& LogMessage::Field(const std::string& key, const std::string& value) {
  fields_text_ += " " + key + "=" + value;
  nlohmann::json j = value;
  fields_json_ += ",\"" + key + "\":" + j.dump();
  return *this;
}

LogMessage::~LogMessage() {
  const LogOptions& options = MutableOptions();
  std::string line;
  if (options.json) {
    nlohmann::json j;
    j["ts"] = Timestamp();
    j["level"] = LevelName(level_);
    if (!options.component.empty()) j["component"] = options.component;
    j["src"] = std::string(Basename(file_)) + ":" + std::to_string(line_);
    j["msg"] = stream_.str();
    line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    line.pop_back();  // reopen the object to append fields
    line += fields_json_ + "}\n";
  } else {
    line = Timestamp() + " " + LevelName(level_);
    if (!options.component.empty()) line += " [" + options.component + "]";
    line += " " + std::string(Basename(file_)) + ":" + std::to_string(line_) + "] " +
            stream_.str() + fields_text_ + "\n";
  }
  static std::mutex mu;
  {
    std::lock_guard<std::mutex> lock(mu);
    ssize_t unused = ::write(2, line.data(), line.size());
    (void)unused;
  }
  if (level_ == LogLevel::kFatal) std::abort();
}

}  // namespace tandem
