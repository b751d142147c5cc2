// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Every URL parser on the same bytes: idem::ParseUrl in both forms, and the
// ParseUrl of each adapter built (sqlite, postgres, redis claim store,
// pre-filter, stream source and publisher, embedded queue, amqp
// source and publisher, kafka source and publisher) and http::Client's base
// URL (Client::Open, which parses and connects to nothing). OpenStore and
// OpenSource are not called: they parse by these same functions and then
// open what the URL names (a file, a server).
// Properties: a URL that parses prints back (FormatUrl) to one that parses
// to the same fields; an adapter that accepts a URL accepts it printed back;
// RedactUrl is idempotent and hides every password ParseUrl finds.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "idem/url.h"
#if IDEM_OPEN_HAVE_SQLITE
#include "idem/sqlite/store.h"
#endif
#if IDEM_OPEN_HAVE_EMBEDDED
#include "idem/embedded/queue.h"
#endif
#if IDEM_OPEN_HAVE_POSTGRES
#include "idem/postgres/store.h"
#endif
#if IDEM_OPEN_HAVE_REDIS
#include "idem/redis/claim_store.h"
#include "idem/redis/prefilter.h"
#endif
#if IDEM_OPEN_HAVE_REDIS_STREAMS
#include "idem/redis/stream_publisher.h"
#include "idem/redis/stream_source.h"
#endif
#if IDEM_OPEN_HAVE_AMQP
#include "idem/amqp/publisher.h"
#include "idem/amqp/source.h"
#endif
#if IDEM_OPEN_HAVE_KAFKA
#include "idem/kafka/source.h"
#endif
#if IDEM_FUZZ_HAVE_HTTP
#include "idem/http/client.h"
#endif

namespace {

bool SameFields(const idem::ParsedUrl& a, const idem::ParsedUrl& b) {
  if (a.scheme != b.scheme || a.has_authority != b.has_authority || a.has_user != b.has_user ||
      a.has_password != b.has_password || a.user != b.user || a.password != b.password || a.path != b.path ||
      a.query != b.query || a.hosts.size() != b.hosts.size())
    return false;
  for (size_t i = 0; i < a.hosts.size(); ++i)
    if (a.hosts[i].host != b.hosts[i].host || a.hosts[i].port != b.hosts[i].port) return false;
  return true;
}

void CheckGrammar(std::string_view url, idem::UrlForm form) {
  auto parsed = idem::ParseUrl(url, "URL", form);
  if (!parsed.ok()) return;
  const std::string printed = idem::FormatUrl(*parsed);
  auto again = idem::ParseUrl(printed, "URL", form);
  if (!again.ok() || !SameFields(*parsed, *again)) __builtin_trap();
  if (idem::FormatUrl(*again) != printed) __builtin_trap();
  // A password ParseUrl found (and the redaction can see: undecoded, not
  // part of the rest of the URL) is hidden by RedactUrl.
  if (parsed->has_password && parsed->password.size() >= 4 && printed.find(parsed->password) != std::string::npos) {
    const std::string redacted = idem::RedactUrl(printed);
    const std::string rest = idem::FormatUrl([&] {
      idem::ParsedUrl p = *parsed;
      p.password.clear();
      return p;
    }());
    if (rest.find(parsed->password) == std::string::npos && redacted.find(parsed->password) != std::string::npos)
      __builtin_trap();
  }
}

// `parse(url)` succeeds exactly when `parse(printed)` does, `printed` being
// `url` printed back by the grammar the adapter reads it with.
template <typename Parse>
void CheckAdapter(std::string_view url, idem::UrlForm form, const Parse& parse) {
  const bool ok = parse(url).ok();
  auto parsed = idem::ParseUrl(url, "URL", form);
  if (!parsed.ok()) return;
  if (ok && !parse(idem::FormatUrl(*parsed)).ok()) __builtin_trap();
}

// CheckAdapter for each T::ParseUrl.
template <typename... T>
void CheckAdapters(std::string_view url, idem::UrlForm form) {
  (CheckAdapter(url, form, [](std::string_view u) { return T::ParseUrl(u); }), ...);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view url(reinterpret_cast<const char*>(data), size);
  CheckGrammar(url, idem::UrlForm::kNetwork);
  CheckGrammar(url, idem::UrlForm::kFile);
  const std::string redacted = idem::RedactUrl(url);
  if (idem::RedactUrl(redacted) != redacted) __builtin_trap();
  (void)idem::UrlScheme(url);
  (void)idem::PercentDecode(url);
  using idem::UrlForm;
#if IDEM_OPEN_HAVE_SQLITE
  if (!idem::UrlScheme(url).empty())  // a bare path is a file name: printed back it is a sqlite: URL
    CheckAdapter(url, UrlForm::kFile, [](std::string_view u) { return idem::sqlite::Store::ParseUrl(u); });
  (void)idem::sqlite::Store::ParseUrl(url);
#endif
#if IDEM_OPEN_HAVE_EMBEDDED
  CheckAdapters<idem::embedded::Queue>(url, UrlForm::kFile);
#endif
#if IDEM_OPEN_HAVE_POSTGRES
  (void)idem::postgres::Store::ParseUrl(url);  // libpq reads the URL as written
#endif
#if IDEM_OPEN_HAVE_REDIS
  CheckAdapters<idem::redis::ClaimStore, idem::redis::Prefilter>(url, UrlForm::kNetwork);
#endif
#if IDEM_OPEN_HAVE_REDIS_STREAMS
  CheckAdapters<idem::redis::StreamSource, idem::redis::StreamPublisher>(url, UrlForm::kNetwork);
#endif
#if IDEM_OPEN_HAVE_AMQP
  CheckAdapters<idem::amqp::Source, idem::amqp::Publisher>(url, UrlForm::kNetwork);
#endif
#if IDEM_OPEN_HAVE_KAFKA
  CheckAdapters<idem::kafka::Source, idem::kafka::Publisher>(url, UrlForm::kNetwork);
#endif
#if IDEM_FUZZ_HAVE_HTTP
  // The base URL keeps its path as written (%-escapes and all), so only
  // its acceptance is checked.
  (void)idem::http::Client::Open({.base_url = std::string(url)});
#endif
  return 0;
}
