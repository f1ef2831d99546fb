// Filters over sequences and mappings of the chat-template interpreter: sort, dictsort, unique,
// select, reject, selectattr, rejectattr and map, with Jinja's attribute paths and Python's
// sorted() (stable, also when reversed; strings compared lowercased unless case_sensitive).

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/tokenizer/chat_template_builtins.h"
#include "common/tokenizer/unicode.h"

namespace tandem::chat_template {
namespace {

// Jinja's ignore_case: strings lowercased, anything else as it is.
Value SortKey(Value v, bool case_sensitive) {
  if (!case_sensitive && v.is_string())
    return Value(Json(unicode::ToLower(v.data().get<std::string>())));
  return v;
}

// Sorts `items` stably by `key` (Python's sorted(items, key=key, reverse=reverse)).
template <typename Key>
absl::Status SortBy(std::vector<Json>* items, bool reverse, Key key) {
  std::vector<Value> keys;
  keys.reserve(items->size());
  for (const Json& item : *items) keys.push_back(key(item));
  std::vector<size_t> order(items->size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  absl::Status error;
  Budget unlimited;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    auto lt = BinaryOp("<", keys[reverse ? b : a], keys[reverse ? a : b], &unlimited);
    if (!lt.ok()) {
      if (error.ok()) error = lt.status();
      return false;
    }
    return lt->Truthy();
  });
  if (!error.ok()) return error;
  std::vector<Json> sorted;
  sorted.reserve(items->size());
  for (size_t i : order) sorted.push_back(std::move((*items)[i]));
  *items = std::move(sorted);
  return absl::OkStatus();
}

// sort(reverse=False, case_sensitive=False, attribute=None); attribute may name several
// comma-separated paths, compared in turn.
absl::StatusOr<Value> Sorted(const Value& input, const CallArgs& args) {
  auto items = Iterate(input);
  if (!items.ok()) return items.status();
  const bool reverse = Arg(args, 0, "reverse").Truthy();
  const bool case_sensitive = Arg(args, 1, "case_sensitive").Truthy();
  Value attr = Arg(args, 2, "attribute");
  std::vector<std::string> paths;
  if (attr.is_string()) {
    paths = absl::StrSplit(attr.data().get<std::string>(), ',', absl::SkipEmpty());
  } else if (attr.is_number()) {
    paths.push_back(attr.ToString());
  }
  // Jinja's keys are lists (one entry per attribute, the item itself without one), compared
  // as Python compares lists: equal entries are passed over, so equal Nones never compare.
  absl::Status st = SortBy(&*items, reverse, [&](const Json& item) {
    Json key = Json::array();
    if (paths.empty()) key.push_back(SortKey(Value(item), case_sensitive).data());
    for (const std::string& p : paths)
      key.push_back(SortKey(GetAttrPath(Value(item), p), case_sensitive).data());
    return Value(std::move(key));
  });
  if (!st.ok()) return st;
  return Value(Json(std::move(*items)));
}

// dictsort(case_sensitive=False, by="key", reverse=False): the (key, value) pairs, sorted.
absl::StatusOr<Value> DictSort(const Value& input, const CallArgs& args) {
  if (!input.is_object() && !input.is_namespace()) {
    return TypeError("dictsort: expected a mapping");
  }
  const bool case_sensitive = Arg(args, 0, "case_sensitive").Truthy();
  Value by = Arg(args, 1, "by");
  const bool reverse = Arg(args, 2, "reverse").Truthy();
  size_t pos = 0;
  if (by.is_string() && by.data().get<std::string>() == "value") {
    pos = 1;
  } else if (!by.is_undefined() && !(by.is_string() && by.data().get<std::string>() == "key")) {
    return TypeError("dictsort: you can only sort by either \"key\" or \"value\"");
  }
  std::vector<Json> pairs;
  const Json& j = input.data();
  for (auto it = j.begin(); it != j.end(); ++it)
    pairs.push_back(Json::array({KeyValue(it.key()), *it}));
  absl::Status st = SortBy(
      &pairs, reverse, [&](const Json& pair) { return SortKey(Value(pair[pos]), case_sensitive); });
  if (!st.ok()) return st;
  return Value(Json(std::move(pairs)));
}

// select / reject / selectattr / rejectattr / map.
absl::StatusOr<Value> Sequence(absl::string_view name, const Value& input, CallArgs& args,
                               Budget* budget) {
  if (!input.Truthy()) return Value(Json::array());  // Jinja's "if value:": none gives nothing
  auto items = Iterate(input);
  if (!items.ok()) return items.status();
  const bool by_attr = name == "selectattr" || name == "rejectattr";
  const bool keep = name == "select" || name == "selectattr";
  Json out = Json::array();
  size_t first = 0;
  std::string attr;
  if (by_attr || name == "map") {
    Value a = name == "map" ? Arg(args, 99, "attribute") : Arg(args, 0, "attribute");
    if (a.is_string() || a.is_number()) attr = a.ToString();
    if (by_attr && attr.empty()) return TypeError(absl::StrCat(name, ": missing attribute"));
    first = by_attr ? 1 : 0;
  }
  CallArgs rest;
  for (size_t i = first + 1; i < args.positional.size(); ++i)
    rest.positional.push_back(args.positional[i]);
  for (const Json& item : *items) {
    Value v = attr.empty() ? Value(item) : GetAttrPath(Value(item), attr);
    if (name == "map") {
      if (!attr.empty()) {
        out.push_back(v.is_undefined() ? Arg(args, 99, "default").data() : v.data());
        continue;
      }
      Value f = Arg(args, 0, "");
      if (!f.is_string()) return TypeError("map: expected a filter name or attribute=");
      auto r = ApplyFilter(f.data().get<std::string>(), v, rest, budget);
      if (!r.ok()) return r.status();
      out.push_back(r->data());
      continue;
    }
    Value test = args.positional.size() > first ? args.positional[first] : Value();
    bool pass;
    if (test.is_undefined()) {
      pass = v.Truthy();
    } else {
      if (!test.is_string()) return TypeError(absl::StrCat(name, ": expected a test name"));
      auto r = ApplyTest(test.data().get<std::string>(), v, rest);
      if (!r.ok()) return r.status();
      pass = *r;
    }
    if (pass == keep) out.push_back(item);
  }
  return Value(std::move(out));
}

}  // namespace

Value GetAttrPath(const Value& obj, const std::string& path) {
  Value v = obj;
  for (absl::string_view part : absl::StrSplit(path, '.')) {
    int64_t index;
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(),
                                                     [](char c) { return c >= '0' && c <= '9'; });
    if (digits && absl::SimpleAtoi(part, &index)) {
      v = GetItem(v, Value(Json(index)));
    } else {
      v = GetItem(v, Value(Json(std::string(part))));
    }
    if (v.is_undefined()) break;
  }
  return v;
}

absl::StatusOr<Value> ApplyListFilter(absl::string_view name, const Value& input, CallArgs& args,
                                      Budget* budget) {
  if (name == "sort") return Sorted(input, args);
  if (name == "dictsort") return DictSort(input, args);
  if (name == "unique") {  // unique(case_sensitive=False, attribute=None): first of each
    auto items = Iterate(input);
    if (!items.ok()) return items.status();
    const bool case_sensitive = Arg(args, 0, "case_sensitive").Truthy();
    Value attr = Arg(args, 1, "attribute");
    Json out = Json::array();
    std::vector<Json> seen;
    for (const Json& e : *items) {
      const Value v = attr.is_undefined() ? Value(e) : GetAttrPath(Value(e), attr.ToString());
      Json key = SortKey(v, case_sensitive).data();
      if (std::none_of(seen.begin(), seen.end(),
                       [&](const Json& s) { return DataEquals(s, key); })) {
        seen.push_back(std::move(key));
        out.push_back(e);
      }
    }
    return Value(std::move(out));
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr" ||
      name == "map") {
    return Sequence(name, input, args, budget);
  }
  if (name == "groupby") {  // groupby(attribute, default=None, case_sensitive=False)
    auto items = Iterate(input);
    if (!items.ok()) return items.status();
    Value attr = Arg(args, 0, "attribute");
    if (!attr.is_string() && !attr.is_number()) return TypeError("groupby: missing attribute");
    const Value fallback = Arg(args, 1, "default");
    const bool case_sensitive = Arg(args, 2, "case_sensitive").Truthy();
    auto value_of = [&](const Json& item) {
      Value v = GetAttrPath(Value(item), attr.ToString());
      return v.is_undefined() && !fallback.is_undefined() ? fallback : v;
    };
    absl::Status st = SortBy(
        &*items, false, [&](const Json& item) { return SortKey(value_of(item), case_sensitive); });
    if (!st.ok()) return st;
    // (grouper, list) pairs, the grouper the group's first value as written; GetAttr reads a
    // pair's .grouper and .list as Jinja's _GroupTuple has them.
    Json out = Json::array();
    Json last_key;
    for (const Json& item : *items) {
      const Json key = SortKey(value_of(item), case_sensitive).data();
      if (out.empty() || !DataEquals(key, last_key)) {
        out.push_back(Json::array({value_of(item).data(), Json::array()}));
        last_key = key;
      }
      out.back()[1].push_back(item);
    }
    return Value(std::move(out));
  }
  if (name == "batch" || name == "slice") {  // batch(linecount) / slice(slices), fill_with
    auto items = Iterate(input);
    if (!items.ok()) return items.status();
    const int64_t n = IntArg(args, 0, name == "batch" ? "linecount" : "slices", 0);
    if (n <= 0) return TypeError(absl::StrCat(name, ": expected a positive count"));
    const Value fill = Arg(args, 1, "fill_with");
    const bool pad = !fill.is_undefined() && !fill.is_none();
    // Filling makes `n` items however few there are: bounded, as every rendering's work is.
    if (pad && name == "batch" && n > 100000) return TypeError("batch: too large to fill");
    const size_t len = items->size();
    Json out = Json::array();
    if (name == "batch") {
      for (size_t i = 0; i < len; i += static_cast<size_t>(n)) {
        Json part = Json::array();
        for (size_t k = i; k < std::min(len, i + static_cast<size_t>(n)); ++k)
          part.push_back((*items)[k]);
        while (pad && part.size() < static_cast<size_t>(n)) part.push_back(fill.data());
        out.push_back(std::move(part));
      }
      return Value(std::move(out));
    }
    // Jinja's slice: `n` columns, the first len % n of them one longer.
    const size_t slices = static_cast<size_t>(std::min<int64_t>(n, 100000));
    const size_t per = len / slices, extra = len % slices;
    size_t offset = 0;
    for (size_t s = 0; s < slices; ++s) {
      const size_t start = offset + s * per;
      if (s < extra) ++offset;
      const size_t end = offset + (s + 1) * per;
      Json part = Json::array();
      for (size_t k = start; k < end && k < len; ++k) part.push_back((*items)[k]);
      if (pad && s >= extra) part.push_back(fill.data());
      out.push_back(std::move(part));
    }
    return Value(std::move(out));
  }
  return absl::NotFoundError("");
}

}  // namespace tandem::chat_template
