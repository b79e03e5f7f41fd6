#include "host-backend/metrics/metric.h"

#include <cstdio>

namespace vsocket::backend::metrics {

const char* ToString(Type t) {
  switch (t) {
    case Type::kCounter: return "counter";
    case Type::kGauge: return "gauge";
  }
  return "?";
}

std::string JsonEscape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

void AppendJsonField(std::string& out, std::string_view name, uint64_t value, bool* first) {
  if (!*first) out += ",";
  *first = false;
  out += "\"";
  out += name;
  out += "\":";
  out += std::to_string(value);
}

void AppendPromHeader(std::string& out, const std::string& family, Type type, std::string_view help) {
  out += "# HELP " + family + " ";
  out += help;
  out += "\n# TYPE " + family + " " + ToString(type) + "\n";
}

void AppendPromSample(std::string& out, const std::string& family, std::vector<std::string> labels, uint64_t value) {
  std::string joined;
  for (const std::string& l : labels)
    if (!l.empty()) joined += (joined.empty() ? "" : ",") + l;
  out += family;
  if (!joined.empty()) out += "{" + joined + "}";
  out += " " + std::to_string(value) + "\n";
}

}  // namespace vsocket::backend::metrics
