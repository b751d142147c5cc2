// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/http/webhook.h"

#include "core/hmac_sha256.h"
#include "core/signal_stop.h"
#include "http/base64.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <atomic>
#include <charconv>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>

namespace idem::http {

std::string_view WebhookSchemeName(WebhookScheme s) {
  switch (s) {
    case WebhookScheme::kStandard: return "standard";
    case WebhookScheme::kGitHub: return "github";
    case WebhookScheme::kStripe: return "stripe";
  }
  return "?";
}

Result<WebhookScheme> ParseWebhookScheme(std::string_view name) {
  for (WebhookScheme s : {WebhookScheme::kStandard, WebhookScheme::kGitHub, WebhookScheme::kStripe}) {
    if (name == WebhookSchemeName(s)) return s;
  }
  return Status::InvalidArgument("unknown webhook scheme '" + Printable(name) + "' (known: standard, github, stripe)");
}

namespace {

using http_internal::Base64Decode;
using http_internal::Base64Encode;

std::optional<std::string> Unhex(std::string_view hex) {
  if (hex.size() % 2) return std::nullopt;
  std::string out;
  for (size_t i = 0; i < hex.size(); i += 2) {
    int v = 0;
    auto [p, ec] = std::from_chars(hex.data() + i, hex.data() + i + 2, v, 16);
    if (ec != std::errc() || p != hex.data() + i + 2) return std::nullopt;
    out += static_cast<char>(v);
  }
  return out;
}

bool SameBytes(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::optional<int64_t> Seconds(std::string_view s) {
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

// A Standard Webhooks secret: "whsec_<base64>" (or the base64 alone).
std::optional<std::string> StandardKey(std::string_view secret) {
  if (secret.substr(0, 6) == "whsec_") secret.remove_prefix(6);
  return Base64Decode(secret);
}

}  // namespace

struct WebhookVerifier::Keys {
  std::vector<std::string> hmac;     // raw HMAC keys
  std::vector<std::string> ed25519;  // raw 32-byte public keys (kStandard, "whpk_")
};

WebhookVerifier::WebhookVerifier(Options options, std::unique_ptr<Keys> keys)
    : options_(std::move(options)), keys_(std::move(keys)) {}
WebhookVerifier::~WebhookVerifier() = default;

Result<std::unique_ptr<WebhookVerifier>> WebhookVerifier::Open(const Options& options) {
  if (options.secrets.empty()) return Status::InvalidArgument("webhook verifier: no secret given");
  if (options.tolerance_ms <= 0) {
    return Status::InvalidArgument("webhook verifier: tolerance_ms must be > 0, not " +
                                   std::to_string(options.tolerance_ms));
  }
  auto keys = std::make_unique<Keys>();
  for (size_t i = 0; i < options.secrets.size(); ++i) {
    const std::string& s = options.secrets[i];
    const std::string which = "webhook verifier: secret " + std::to_string(i + 1);
    if (s.empty()) return Status::InvalidArgument(which + " is empty");
    if (options.scheme == WebhookScheme::kStandard) {
      if (s.substr(0, 5) == "whpk_") {
        auto key = Base64Decode(std::string_view(s).substr(5));
        if (!key || key->size() != 32) {
          return Status::InvalidArgument(which + ": a whpk_ key must be the base64 of a 32-byte ed25519 public key");
        }
        keys->ed25519.push_back(*key);
        continue;
      }
      auto key = StandardKey(s);
      if (!key || key->empty()) {
        return Status::InvalidArgument(which + ": a Standard Webhooks secret is whsec_ followed by base64");
      }
      keys->hmac.push_back(*key);
    } else {
      keys->hmac.push_back(s);  // GitHub's secret text; Stripe's whsec_... string, as given
    }
  }
  return std::unique_ptr<WebhookVerifier>(new WebhookVerifier(options, std::move(keys)));
}

namespace {

Status CheckTime(int64_t ts_s, const WebhookVerifier::Options& o) {
  Env* env = o.env ? o.env : Env::Default();
  // In 128 bits: a sender's timestamp may be any 64-bit number.
  const __int128 now_ms = env->NowMs(), at_ms = static_cast<__int128>(ts_s) * 1000;
  if (at_ms < now_ms - o.tolerance_ms) {
    return Status::Rejected("webhook timestamp " + std::to_string(ts_s) + " is " +
                            std::to_string(static_cast<int64_t>((now_ms - at_ms) / 1000)) + " s old (tolerance " +
                            std::to_string(o.tolerance_ms / 1000) + " s)");
  }
  if (at_ms > now_ms + o.tolerance_ms) {
    return Status::Rejected("webhook timestamp " + std::to_string(ts_s) + " is " +
                            std::to_string(static_cast<int64_t>((at_ms - now_ms) / 1000)) +
                            " s in the future (tolerance " + std::to_string(o.tolerance_ms / 1000) + " s)");
  }
  return Status::OK();
}

bool Ed25519Verify(std::string_view key, std::string_view sig, std::string_view data) {
  EVP_PKEY* pk = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr,
                                             reinterpret_cast<const unsigned char*>(key.data()), key.size());
  if (pk == nullptr) return false;
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  bool ok = ctx != nullptr && EVP_DigestVerifyInit(ctx, nullptr, nullptr, nullptr, pk) == 1 &&
            EVP_DigestVerify(ctx, reinterpret_cast<const unsigned char*>(sig.data()), sig.size(),
                             reinterpret_cast<const unsigned char*>(data.data()), data.size()) == 1;
  EVP_MD_CTX_free(ctx);
  EVP_PKEY_free(pk);
  return ok;
}

// `j[key]` when `j` is an object and that is a string; "" otherwise.
std::string JsonString(const nlohmann::json& j, const char* key) {
  auto it = j.is_object() ? j.find(key) : j.end();
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

const std::string& Required(const Headers& h, std::string_view name, Status& missing) {
  static const std::string kEmpty;
  const std::string* v = h.Find(name);
  if (v == nullptr || v->empty()) {
    if (missing.ok())
      missing = Status::InvalidArgument("not a webhook: the " + std::string(name) + " header is missing");
    return kEmpty;
  }
  return *v;
}

}  // namespace

Result<WebhookEvent> WebhookVerifier::Verify(const Request& r) const {
  WebhookEvent ev;
  Status missing;
  switch (options_.scheme) {
    case WebhookScheme::kStandard: {
      const std::string& id = Required(r.headers, "webhook-id", missing);
      const std::string& ts = Required(r.headers, "webhook-timestamp", missing);
      const std::string& sigs = Required(r.headers, "webhook-signature", missing);
      if (!missing.ok()) return missing;
      IDEM_RETURN_IF_ERROR(ValidateId(id).WithContext("webhook-id"));
      auto t = Seconds(ts);
      if (!t)
        return Status::InvalidArgument("not a webhook: webhook-timestamp '" + Printable(ts) + "' is not a number");
      IDEM_RETURN_IF_ERROR(CheckTime(*t, options_));
      const std::string signed_content = id + "." + ts + "." + r.body;
      bool any = false, ok = false;
      std::string_view rest = sigs;
      while (!rest.empty() && !ok) {
        size_t sp = rest.find(' ');
        std::string_view item = rest.substr(0, sp);
        rest = sp == std::string_view::npos ? std::string_view() : rest.substr(sp + 1);
        if (item.empty()) continue;
        size_t comma = item.find(',');
        if (comma == std::string_view::npos) continue;
        std::string_view version = item.substr(0, comma);
        auto sig = Base64Decode(item.substr(comma + 1));
        if (!sig) continue;
        if (version == "v1") {
          any = true;
          for (const std::string& k : keys_->hmac) ok = ok || SameBytes(internal::HmacSha256(k, signed_content), *sig);
        } else if (version == "v1a") {
          any = true;
          for (const std::string& k : keys_->ed25519) ok = ok || Ed25519Verify(k, *sig, signed_content);
        }
      }
      if (!any) {
        return Status::InvalidArgument("not a webhook: webhook-signature has no v1 or v1a signature: '" +
                                       Printable(sigs) + "'");
      }
      if (!ok) return Status::Rejected("webhook signature does not verify with any of the secrets (event " + id + ")");
      ev.id = id;
      ev.timestamp_s = *t;
      ev.type = JsonString(nlohmann::json::parse(r.body, nullptr, false), "type");
      return ev;
    }
    case WebhookScheme::kGitHub: {
      const std::string& id = Required(r.headers, "X-GitHub-Delivery", missing);
      const std::string& sig = Required(r.headers, "X-Hub-Signature-256", missing);
      if (!missing.ok()) return missing;
      IDEM_RETURN_IF_ERROR(ValidateId(id).WithContext("X-GitHub-Delivery"));
      if (sig.substr(0, 7) != "sha256=") {
        return Status::InvalidArgument("not a webhook: X-Hub-Signature-256 does not begin with sha256=");
      }
      auto want = Unhex(std::string_view(sig).substr(7));
      if (!want) return Status::InvalidArgument("not a webhook: X-Hub-Signature-256 is not hex");
      bool ok = false;
      for (const std::string& k : keys_->hmac) ok = ok || SameBytes(internal::HmacSha256(k, r.body), *want);
      if (!ok)
        return Status::Rejected("webhook signature does not verify with any of the secrets (delivery " + id + ")");
      ev.id = id;
      ev.type = r.headers.Get("X-GitHub-Event");
      return ev;
    }
    case WebhookScheme::kStripe: {
      const std::string& header = Required(r.headers, "Stripe-Signature", missing);
      if (!missing.ok()) return missing;
      std::optional<int64_t> t;
      std::string t_text;
      std::vector<std::string> v1;
      std::string_view rest = header;
      while (!rest.empty()) {
        size_t comma = rest.find(',');
        std::string_view item = Trim(rest.substr(0, comma));
        rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
        size_t eq = item.find('=');
        if (eq == std::string_view::npos) continue;
        std::string_view k = item.substr(0, eq), v = item.substr(eq + 1);
        if (k == "t") t = Seconds(v), t_text = std::string(v);
        if (k == "v1") {
          if (auto b = Unhex(v)) v1.push_back(*b);
        }
      }
      if (!t) return Status::InvalidArgument("not a webhook: Stripe-Signature has no timestamp t=");
      if (v1.empty()) return Status::InvalidArgument("not a webhook: Stripe-Signature has no v1= signature");
      IDEM_RETURN_IF_ERROR(CheckTime(*t, options_));
      const std::string signed_payload = t_text + "." + r.body;
      bool ok = false;
      for (const std::string& k : keys_->hmac) {
        const std::string mac = internal::HmacSha256(k, signed_payload);
        for (const std::string& s : v1) ok = ok || SameBytes(mac, s);
      }
      if (!ok) return Status::Rejected("webhook signature does not verify with any of the secrets");
      auto j = nlohmann::json::parse(r.body, nullptr, false);
      ev.id = JsonString(j, "id");
      if (ev.id.empty()) return Status::InvalidArgument("a Stripe event without an \"id\" string in its JSON body");
      IDEM_RETURN_IF_ERROR(ValidateId(ev.id).WithContext("the event's id"));
      ev.type = JsonString(j, "type");
      ev.timestamp_s = *t;
      return ev;
    }
  }
  return Status::Internal("webhook verifier: unknown scheme");
}

Result<Headers> SignWebhook(WebhookScheme scheme, std::string_view secret, std::string_view id, int64_t ts,
                            std::string_view body) {
  Headers h;
  const std::string t = std::to_string(ts);
  switch (scheme) {
    case WebhookScheme::kStandard: {
      auto key = StandardKey(secret);
      if (!key || key->empty())
        return Status::InvalidArgument("a Standard Webhooks secret is whsec_ followed by base64");
      std::string content = std::string(id) + "." + t + "." + std::string(body);
      h.Add("webhook-id", std::string(id));
      h.Add("webhook-timestamp", t);
      h.Add("webhook-signature", "v1," + Base64Encode(internal::HmacSha256(*key, content)));
      return h;
    }
    case WebhookScheme::kGitHub:
      h.Add("X-GitHub-Delivery", std::string(id));
      h.Add("X-GitHub-Event", "push");
      h.Add("X-Hub-Signature-256", "sha256=" + internal::LowerHex(internal::HmacSha256(secret, body)));
      return h;
    case WebhookScheme::kStripe:
      h.Add("Stripe-Signature",
            "t=" + t + ",v1=" + internal::LowerHex(internal::HmacSha256(secret, t + "." + std::string(body))));
      return h;
  }
  return Status::InvalidArgument("unknown webhook scheme");
}

// ---------------------------------------------------------------------------
// The receiver.

struct WebhookReceiver::State {
  Store* store = nullptr;
  Options options;
  std::unique_ptr<Inbox> inbox;
  Handler handler;
  std::optional<CallFirst> call_first;
  Publisher* publisher = nullptr;
  std::atomic<uint64_t> applied{0}, replayed{0}, conflicts{0}, malformed{0}, unverified{0}, in_progress{0}, rejected{0},
      failed{0}, group_commits{0}, grouped{0}, stopped{0};
  std::atomic<bool> stopping{false};  // Stop()

  // Group commit (Options::group_commit_max > 1): the deliveries waiting
  // for a transaction, oldest first; one request thread at a time (the
  // leader) takes up to group_commit_max of them into one HandleBatch.
  struct Waiting {
    const Message* message;
    Outcome outcome;
    bool done = false;
  };
  std::mutex group_mu;
  std::condition_variable group_cv;
  std::deque<Waiting*> waiting;
  bool leading = false;

  Outcome HandleOne(const Message& m) { return call_first ? inbox->Handle(m, *call_first) : inbox->Handle(m, handler); }
  Outcome HandleGrouped(const Message& m);
};

Outcome WebhookReceiver::State::HandleGrouped(const Message& m) {
  Waiting me{.message = &m};
  std::unique_lock<std::mutex> l(group_mu);
  waiting.push_back(&me);
  while (!me.done) {
    if (leading) {
      group_cv.wait(l);
      continue;
    }
    // Lead one group: the oldest waiting deliveries (this one among them
    // sooner or later), handled in one transaction outside the lock, while
    // the next deliveries queue up for the group after it.
    leading = true;
    std::vector<Waiting*> group;
    while (!waiting.empty() && group.size() < static_cast<size_t>(options.group_commit_max)) {
      group.push_back(waiting.front());
      waiting.pop_front();
    }
    l.unlock();
    std::vector<Message> batch;
    batch.reserve(group.size());
    for (const Waiting* w : group) batch.push_back(*w->message);
    std::vector<Outcome> out = call_first ? inbox->HandleBatch(batch, *call_first) : inbox->HandleBatch(batch, handler);
    group_commits++;
    grouped += group.size();
    l.lock();
    for (size_t i = 0; i < group.size(); ++i) {
      group[i]->outcome = std::move(out[i]);
      group[i]->done = true;
    }
    leading = false;
    group_cv.notify_all();
  }
  return me.outcome;
}

WebhookReceiver::WebhookReceiver(std::unique_ptr<State> state, std::unique_ptr<WebhookVerifier> verifier)
    : state_(std::move(state)), verifier_(std::move(verifier)) {}
// A signal after this must not reach a destroyed receiver (StopOnSignals).
WebhookReceiver::~WebhookReceiver() { internal::DetachFromSignals(this); }

void WebhookReceiver::Stop() noexcept { state_->stopping.store(true); }
bool WebhookReceiver::stopping() const noexcept { return state_->stopping.load(); }

namespace {

Result<std::unique_ptr<Inbox>> OpenInbox(Store& store, const WebhookReceiver::Options& o) {
  if (o.group_commit_max < 0 || o.group_commit_max > 10'000) {
    return Status::InvalidArgument("webhook receiver: group_commit_max must be 0..10000, not " +
                                   std::to_string(o.group_commit_max));
  }
  if (o.retention_ms <= 0) {
    return Status::InvalidArgument("webhook receiver: retention_ms must be > 0, not " + std::to_string(o.retention_ms));
  }
  return Inbox::Open(store, {.consumer = o.consumer, .env = o.verify.env, .observer = o.observer});
}

Answer Json(int status, std::string_view outcome, std::string_view id, std::string_view error = {}) {
  nlohmann::json j = {{"outcome", outcome}};
  if (!id.empty()) j["id"] = std::string(id);
  if (!error.empty()) j["error"] = std::string(error);
  Answer a;
  a.status = status;
  // A sender's bytes that are not UTF-8 are replaced, never thrown on.
  a.SetBody(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), "application/json");
  return a;
}

// The event id a refused request carries (not verified), for its error
// body: the scheme's id header, or a Stripe body's "id"; "" when it carries
// none. An id too long to be one is shown cut and escaped.
std::string ClaimedId(const Request& r, WebhookScheme scheme) {
  std::string id;
  switch (scheme) {
    case WebhookScheme::kStandard: id = r.headers.Get("webhook-id"); break;
    case WebhookScheme::kGitHub: id = r.headers.Get("X-GitHub-Delivery"); break;
    case WebhookScheme::kStripe: id = JsonString(nlohmann::json::parse(r.body, nullptr, false), "id"); break;
  }
  return ValidateId(id).ok() || id.empty() ? id : Printable(id);
}

}  // namespace

Result<std::unique_ptr<WebhookReceiver>> WebhookReceiver::Make(Store& store, const Options& options, Handler handler,
                                                               std::optional<CallFirst> call_first) {
  IDEM_ASSIGN_OR_RETURN(auto verifier, WebhookVerifier::Open(options.verify));
  auto st = std::make_unique<State>();
  st->store = &store;
  st->options = options;
  IDEM_ASSIGN_OR_RETURN(st->inbox, OpenInbox(store, options));
  st->handler = std::move(handler);
  st->call_first = std::move(call_first);
  return std::unique_ptr<WebhookReceiver>(new WebhookReceiver(std::move(st), std::move(verifier)));
}

Result<std::unique_ptr<WebhookReceiver>> WebhookReceiver::Open(Store& store, Handler handler, const Options& options) {
  if (!handler) return Status::InvalidArgument("webhook receiver: the handler is empty");
  return Make(store, options, std::move(handler), std::nullopt);
}

Result<std::unique_ptr<WebhookReceiver>> WebhookReceiver::Open(Store& store, CallFirst handler,
                                                               const Options& options) {
  if (!handler.complete()) return Status::InvalidArgument("webhook receiver: the CallFirst needs both its parts");
  return Make(store, options, nullptr, std::move(handler));
}

Result<std::unique_ptr<WebhookReceiver>> WebhookReceiver::Open(Store& store, Publisher& publisher,
                                                               const Options& options) {
  Publisher* p = &publisher;
  const std::string destination = options.destination;
  // The publish runs in the handler: before the marker commits, so an event
  // is on the queue before its 200 (and again after a crash in between).
  Handler enqueue = [p, destination](Transaction&, const Message& m) -> Status {
    if (destination.empty()) return p->Publish(m);
    Outgoing out{.destination = destination, .message = &m};
    return p->PublishBatch(std::span<const Outgoing>(&out, 1))[0];
  };
  IDEM_ASSIGN_OR_RETURN(auto r, Open(store, std::move(enqueue), options));
  r->state_->publisher = p;
  return r;
}

Answer WebhookReceiver::Handle(const Request& request) {
  State& s = *state_;
  auto ev = verifier_->Verify(request);
  if (!ev.ok()) {
    const std::string id = ClaimedId(request, s.options.verify.scheme);
    if (ev.status().IsRejected()) {
      s.unverified++;
      return Json(401, "unverified", id, ev.status().message());
    }
    s.malformed++;
    return Json(400, "malformed", id, ev.status().message());
  }
  if (s.stopping.load()) {  // nothing stored: the sender delivers it again, here after a restart or elsewhere
    s.stopped++;
    Answer a = Json(503, "stopping", ev->id, "the receiver is stopping; deliver it again later");
    a.headers.Set("Retry-After", "1");
    return a;
  }
  Message m;
  m.id = ev->id;
  m.payload = request.body;
  if (!ev->type.empty()) m.headers.emplace_back("webhook-type", ev->type);
  if (ev->timestamp_s >= 0) m.headers.emplace_back("webhook-timestamp", std::to_string(ev->timestamp_s));
  // Stripe's event body changes between deliveries of one event (its
  // pending_webhooks count; a resend rendered for another API version), so
  // there the signed event id alone names the event: a known id is a
  // replay whatever its body, found before the Inbox would call it a
  // conflict (and, if two such deliveries race, answered as one after it).
  const bool id_names_event = s.options.verify.scheme == WebhookScheme::kStripe;
  if (id_names_event) {
    auto known = s.store->FindMarker(s.options.consumer, m.id);
    if (known.ok() && known->has_value()) {
      s.replayed++;
      return Json(200, "duplicate", m.id);
    }
  }
  Outcome o = s.options.group_commit_max > 1 ? s.HandleGrouped(m) : s.HandleOne(m);
  if (id_names_event && o.kind == Outcome::Kind::kConflict) o.kind = Outcome::Kind::kDuplicate;
  switch (o.kind) {
    case Outcome::Kind::kApplied: s.applied++; return Json(200, s.publisher ? "enqueued" : "applied", m.id);
    case Outcome::Kind::kDuplicate: s.replayed++; return Json(200, "duplicate", m.id);
    case Outcome::Kind::kConflict:
      s.conflicts++;
      return Json(422, "conflict", m.id, "this event id was delivered before with another body");
    case Outcome::Kind::kFailed: break;
  }
  if (o.status.IsRejected()) {
    // The handler says this event can never be handled: dead-lettered
    // (reason "rejected", listed by `idem dead-letters`) and answered 200,
    // so the sender stops retrying something no retry can fix.
    Env* env = s.options.verify.env ? s.options.verify.env : Env::Default();
    auto dl = s.store->RecordFailure({.consumer = s.options.consumer,
                                      .message = &m,
                                      .error = o.status.message(),
                                      .now_ms = env->NowMs(),
                                      .kind = FailureRecord::Kind::kRejected});
    if (dl.ok()) {
      s.rejected++;
      return Json(200, "rejected", m.id, o.status.message());
    }
    s.failed++;
    return Json(500, "failed", m.id, dl.status().ToString());
  }
  if (o.status.IsInProgress()) {
    s.in_progress++;
    Answer a = Json(429, "in_progress", m.id, o.status.message());
    a.headers.Set("Retry-After", "1");
    return a;
  }
  s.failed++;
  return Json(500, "failed", m.id, o.status.ToString());
}

Result<int64_t> WebhookReceiver::Purge() {
  Env* env = state_->options.verify.env ? state_->options.verify.env : Env::Default();
  return state_->store->Purge(state_->options.consumer, env->NowMs() - state_->options.retention_ms, 1000);
}

WebhookCounters WebhookReceiver::counters() const {
  const State& s = *state_;
  return {.applied = s.applied,
          .replayed = s.replayed,
          .conflicts = s.conflicts,
          .malformed = s.malformed,
          .unverified = s.unverified,
          .in_progress = s.in_progress,
          .rejected = s.rejected,
          .failed = s.failed,
          .group_commits = s.group_commits,
          .grouped = s.grouped,
          .stopped = s.stopped};
}

}  // namespace idem::http

void idem::StopOnSignals(http::WebhookReceiver* receiver) { internal::StopOnSignalsOf(receiver); }
