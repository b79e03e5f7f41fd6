// A metric as the registry (registry.h) holds it: name, help text, type,
// Prometheus name and labels, and how to read it from a row; and the
// Prometheus and JSON rendering every output shares.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace vsocket::backend::metrics {

enum class Type : uint8_t { kCounter, kGauge };
const char* ToString(Type t);  // "counter", "gauge"

// Where a metric shows in Prometheus. Several metrics may share a family,
// told apart by constant labels (direction="out" / direction="in").
struct PromName {
  std::string_view family = {};  // empty: "vsocket_" + the metric's name (+ "_total" for a counter)
  std::string_view labels = {};  // constant labels, e.g. reason="other"; may be empty
};

// One metric of a table whose rows are Row: one row for the daemon-wide
// counters, one per VM, one per peer host.
template <typename Row>
struct Metric {
  std::string_view name;  // its JSON field and its text column (or, daemon-wide, its row)
  Type type;
  std::string_view help;
  uint64_t (*read)(const Row&);
  PromName prom = {};
  // Daemon-wide counters: the object of `stats` JSON it is in, and its row
  // in `counters` where that differs from `name` (names scripts read).
  std::string_view group = {};
  std::string_view row = {};
  // Labels a row adds to this metric only (e.g. the peer's fabric kind).
  std::string (*row_labels)(const Row&) = nullptr;

  std::string_view text_name() const { return row.empty() ? name : row; }
  std::string family() const {
    if (!prom.family.empty()) return std::string(prom.family);
    return "vsocket_" + std::string(text_name()) + (type == Type::kCounter ? "_total" : "");
  }
};

std::string JsonEscape(std::string_view s);
// "name":value, with a comma before it unless it is the first in its object.
void AppendJsonField(std::string& out, std::string_view name, uint64_t value, bool* first);

// Appends the Prometheus exposition of `metrics` over `rows`: per family
// (in the order families first appear) its HELP and TYPE (the first
// member's), then for each row each member's sample, labelled with
// row_labels(row) (null: none), the member's constant labels and its own
// row labels.
template <typename Row>
void AppendPrometheus(std::string& out, const std::vector<Metric<Row>>& metrics, const std::vector<Row>& rows,
                      std::type_identity_t<std::string (*)(const Row&)> row_labels);

// Implementation.

void AppendPromHeader(std::string& out, const std::string& family, Type type, std::string_view help);
void AppendPromSample(std::string& out, const std::string& family, std::vector<std::string> labels, uint64_t value);

template <typename Row>
void AppendPrometheus(std::string& out, const std::vector<Metric<Row>>& metrics, const std::vector<Row>& rows,
                      std::type_identity_t<std::string (*)(const Row&)> row_labels) {
  std::vector<std::string> families;
  for (const Metric<Row>& m : metrics) {
    std::string f = m.family();
    bool seen = false;
    for (const std::string& g : families) seen |= g == f;
    if (!seen) families.push_back(f);
  }
  for (const std::string& f : families) {
    bool header = false;
    for (const Row& row : rows) {
      for (const Metric<Row>& m : metrics) {
        if (m.family() != f) continue;
        if (!header) {
          AppendPromHeader(out, f, m.type, m.help);
          header = true;
        }
        AppendPromSample(
            out, f,
            {row_labels ? row_labels(row) : "", m.row_labels ? m.row_labels(row) : "", std::string(m.prom.labels)},
            m.read(row));
      }
    }
    if (!header) {  // no rows: the family is still announced
      for (const Metric<Row>& m : metrics)
        if (m.family() == f) {
          AppendPromHeader(out, f, m.type, m.help);
          break;
        }
    }
  }
}

}  // namespace vsocket::backend::metrics
