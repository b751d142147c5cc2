// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/id_from.h"

#include <cctype>
#include <nlohmann/json.hpp>
#include <optional>

namespace idem {

namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}

// The value of the first header named `name`, compared without regard to
// ASCII case (brokers keep the producer's spelling; HTTP does not).
std::optional<std::string_view> HeaderNoCase(const Message& m, std::string_view name) {
  for (const auto& [k, v] : m.headers) {
    if (k.size() != name.size()) continue;
    bool same = true;
    for (size_t i = 0; i < k.size() && same; ++i) {
      same = std::tolower(static_cast<unsigned char>(k[i])) == std::tolower(static_cast<unsigned char>(name[i]));
    }
    if (same) return std::string_view(v);
  }
  return std::nullopt;
}

}  // namespace

Result<IdFrom> IdFrom::Parse(std::string_view spec) {
  IdFrom out;
  out.spec_ = std::string(spec);
  if (Trim(spec).empty()) return Status::InvalidArgument("id-from: empty (want json:/pointer or header:Name)");
  std::string_view rest = spec;
  while (true) {
    const size_t plus = rest.find('+');
    std::string_view item = Trim(rest.substr(0, plus));
    Part p;
    if (item.substr(0, 5) == "json:") {
      std::string_view ptr = item.substr(5);
      if (ptr.empty() || ptr[0] != '/') {
        return Status::InvalidArgument("id-from: the JSON pointer '" + std::string(ptr) +
                                       "' must start with '/' (RFC 6901: json:/order/id)");
      }
      p.name = std::string(ptr);
      // Reference tokens: split on '/', then ~1 -> '/', ~0 -> '~'.
      for (size_t at = 1; at <= ptr.size();) {
        size_t slash = ptr.find('/', at);
        if (slash == std::string_view::npos) slash = ptr.size();
        std::string token;
        std::string_view raw = ptr.substr(at, slash - at);
        for (size_t i = 0; i < raw.size(); ++i) {
          if (raw[i] != '~') {
            token += raw[i];
          } else if (i + 1 < raw.size() && (raw[i + 1] == '0' || raw[i + 1] == '1')) {
            token += raw[++i] == '0' ? '~' : '/';
          } else {
            return Status::InvalidArgument("id-from: '" + std::string(ptr) + "' has a '~' not followed by 0 or 1");
          }
        }
        p.tokens.push_back(std::move(token));
        at = slash + 1;
      }
    } else if (item.substr(0, 7) == "header:") {
      p.json = false;
      p.name = std::string(Trim(item.substr(7)));
      if (p.name.empty()) return Status::InvalidArgument("id-from: header: needs a header name");
    } else {
      return Status::InvalidArgument("id-from: '" + std::string(item) +
                                     "' is neither json:/pointer nor header:Name (parts join with '+')");
    }
    out.parts_.push_back(std::move(p));
    if (plus == std::string_view::npos) break;
    rest = rest.substr(plus + 1);
  }
  return out;
}

Result<std::string> IdFrom::Extract(const Message& m) const {
  std::string id;
  nlohmann::json doc;
  bool parsed = false;
  for (size_t i = 0; i < parts_.size(); ++i) {
    const Part& p = parts_[i];
    std::string value;
    if (!p.json) {
      auto h = HeaderNoCase(m, p.name);
      if (!h || h->empty()) return Status::Rejected("id-from: the message has no " + p.name + " header");
      value = std::string(*h);
    } else {
      if (!parsed) {
        doc = nlohmann::json::parse(m.payload, nullptr, /*allow_exceptions=*/false);
        if (doc.is_discarded()) return Status::Rejected("id-from: the payload is not JSON, so it has no " + p.name);
        parsed = true;
      }
      const nlohmann::json* at = &doc;
      for (const std::string& t : p.tokens) {
        if (at->is_object()) {
          auto it = at->find(t);
          if (it == at->end()) return Status::Rejected("id-from: the payload has no " + p.name);
          at = &*it;
        } else if (at->is_array()) {
          size_t idx = 0;
          bool digits = !t.empty() && t.size() < 10 && (t == "0" || t[0] != '0');
          for (char c : t) digits = digits && c >= '0' && c <= '9';
          if (digits) idx = std::stoul(t);
          if (!digits || idx >= at->size()) return Status::Rejected("id-from: the payload has no " + p.name);
          at = &(*at)[idx];
        } else {
          return Status::Rejected("id-from: the payload has no " + p.name);
        }
      }
      if (at->is_string()) {
        value = at->get<std::string>();
      } else if (at->is_number_integer()) {
        value = at->dump();
      } else {
        return Status::Rejected("id-from: " + p.name + " in the payload is " + std::string(at->type_name()) +
                                ", not a string or an integer");
      }
      if (value.empty()) return Status::Rejected("id-from: " + p.name + " in the payload is empty");
    }
    if (parts_.size() == 1) {
      id = std::move(value);
      break;
    }
    // Parts joined by ':', each with '\' and ':' escaped, so no two
    // different lists of values give one id.
    if (i) id += ':';
    for (char c : value) {
      if (c == '\\' || c == ':') id += '\\';
      id += c;
    }
  }
  IDEM_RETURN_IF_ERROR(ValidateId(id).WithContext("id-from " + spec_));
  return id;
}

}  // namespace idem
