// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem::http::Request and idem::http::Answer: the request the Idempotency-Key
// middleware (idem/http/idempotency.h) decides on, and the answer it gives or
// stores. They belong to no HTTP library: an adapter (idem/httplib/ for
// cpp-httplib) converts its framework's request into a Request and an Answer
// back into its framework's response; code for another framework does the
// same in a few lines (doc/http.md).
//
// Thread safety: plain values (one thread at a time per object).
#ifndef IDEM_HTTP_REQUEST_H_
#define IDEM_HTTP_REQUEST_H_

#include <cstddef>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace idem::http {

// Header fields in the order they were added. Names are compared without
// regard to case (HTTP's rule): Get("content-type") finds "Content-Type".
class Headers {
 public:
  using Field = std::pair<std::string, std::string>;

  Headers() = default;
  Headers(std::initializer_list<Field> fields) : fields_(fields) {}

  // Adds a field (a name may appear more than once).
  void Add(std::string name, std::string value);
  // Replaces every field named `name` with one field (added at the end if
  // there was none).
  void Set(std::string_view name, std::string value);
  // Removes every field named `name`.
  void Remove(std::string_view name);

  // The first value of `name`, or null when absent.
  const std::string* Find(std::string_view name) const;
  // The first value of `name`, or "" when absent.
  std::string Get(std::string_view name) const;
  // How many fields are named `name`.
  size_t Count(std::string_view name) const;
  bool Has(std::string_view name) const { return Find(name) != nullptr; }

  std::vector<Field>::const_iterator begin() const { return fields_.begin(); }
  std::vector<Field>::const_iterator end() const { return fields_.end(); }
  size_t size() const { return fields_.size(); }
  bool empty() const { return fields_.empty(); }

 private:
  std::vector<Field> fields_;
};

// ASCII case-insensitive equality (header names).
bool EqualsIgnoringCase(std::string_view a, std::string_view b);

// A request as the middleware sees it.
struct Request {
  std::string method{};  // "POST"
  std::string path{};    // the request target as received ("/charges?x=1"), for logs
  Headers headers{};
  std::string body{};
};

// A response: what a handler writes, what the middleware answers with, and
// (its end-to-end part) what it stores and replays.
struct Answer {
  int status = 200;
  Headers headers{};
  std::string body{};

  // Sets the body and its Content-Type.
  void SetBody(std::string content, std::string_view content_type);
};

}  // namespace idem::http

#endif  // IDEM_HTTP_REQUEST_H_
