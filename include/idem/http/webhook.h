// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Webhooks: a receiver that verifies the sender's signature over the raw
// body before anything is stored, then runs your handler once per event id
// (in the transaction that inserts the event's marker), or puts the event on
// a queue and answers 2xx. Senders deliver webhooks at least once and retry
// for days; a retry carries the same event id (and, for most senders, a fresh
// timestamp and signature), so the id is what makes the repeat change nothing.
//
//   auto receiver = idem::http::WebhookReceiver::Open(*store, handler, {
//       .verify = {.scheme = idem::http::WebhookScheme::kStandard, .secrets =
//       {"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}}, .consumer = "billing-webhooks"});
//   idem::http::Answer a = (*receiver)->Handle(request);   // request: idem::http::Request (any framework)
//
// Signature schemes (WebhookScheme):
//  - kStandard: Standard Webhooks 1.0 (webhook-id, webhook-timestamp,
//    webhook-signature). "v1,<base64>" is HMAC-SHA256 with a "whsec_<base64>"
//    secret; "v1a,<base64>" is ed25519 with a "whpk_<base64>" public key. The
//    header may carry several signatures (key rotation): one that verifies
//    with one of the secrets is enough. Signed: "<id>.<timestamp>.<body>".
//  - kGitHub: X-Hub-Signature-256 ("sha256=<hex>", HMAC-SHA256 of the body
//    with the webhook's secret), the event id from X-GitHub-Delivery, its
//    type from X-GitHub-Event. GitHub signs no timestamp.
//  - kStripe: Stripe-Signature ("t=<seconds>,v1=<hex>[,v1=...]", HMAC-SHA256
//    of "<t>.<body>" with the endpoint secret "whsec_..." as given), the
//    event id and type from the JSON body's "id" and "type". Stripe renders
//    an event's body anew for each delivery (pending_webhooks), so here a
//    known event id is a replay whatever the body: never a 422.
// Signatures are compared in constant time. A signed timestamp more than
// Options::tolerance_ms from now (too old or too far ahead) is refused.
//
// Answers: 200 for an event handled now or before (a replay runs nothing);
// 400 for a request that is not a webhook of the scheme (a header missing or
// malformed, a Stripe body without an id); 401 for a signature that does not
// verify or a timestamp out of tolerance; 422 for an event id seen before
// with another body (a conflict, counted); 429 with Retry-After while a step
// of the same event is in progress elsewhere; 500 when the store or the
// handler failed (the sender retries); 503 with Retry-After once Stop() was
// called. Nothing is stored for a 400, 401 or 503.
// A handler that returns Status::Rejected (the event can never be handled)
// gets it dead-lettered (reason "rejected") and answered 200: no retry of
// the sender's would change it, and it is kept for an operator.
//
// Retention: keep the markers at least as long as the senders retry
// (Options::retention_ms, default 7 days: Stripe retries for 3 days, others
// for days too). A timestamp tolerance does not replace it: a retry is signed
// anew, so only the id tells it from a new event.
//
// Thread safety: Verify and Handle may be called from many threads.
#ifndef IDEM_HTTP_WEBHOOK_H_
#define IDEM_HTTP_WEBHOOK_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/call_first.h"
#include "idem/env.h"
#include "idem/http/request.h"
#include "idem/inbox.h"
#include "idem/observer.h"
#include "idem/publisher.h"
#include "idem/result.h"
#include "idem/signals.h"
#include "idem/status.h"
#include "idem/store.h"

namespace idem::http {

enum class WebhookScheme { kStandard, kGitHub, kStripe };
// "standard", "github", "stripe".
std::string_view WebhookSchemeName(WebhookScheme scheme);
// The scheme of a name above; kInvalidArgument naming the known ones.
Result<WebhookScheme> ParseWebhookScheme(std::string_view name);

// A delivery whose signature verified.
struct WebhookEvent {
  std::string id{};          // the sender's event id
  std::string type{};        // the event's type where the scheme names one ("" otherwise)
  int64_t timestamp_s = -1;  // the signed timestamp, in Unix seconds (-1: the scheme signs none)
};

class WebhookVerifier {
 public:
  struct Options {
    WebhookScheme scheme = WebhookScheme::kStandard;
    // The secrets any of which may have signed (more than one while a
    // secret is rotated): see the schemes above. At least one.
    std::vector<std::string> secrets{};
    // How far a signed timestamp may be from now, either way. Default: 5 min.
    int64_t tolerance_ms = 5 * 60 * 1000;
    // The clock now is read from. Default: Env::Default().
    Env* env = nullptr;
  };
  // Checks the options and decodes the secrets (kInvalidArgument naming a
  // malformed one).
  static Result<std::unique_ptr<WebhookVerifier>> Open(const Options& options);
  ~WebhookVerifier();
  WebhookVerifier(const WebhookVerifier&) = delete;
  WebhookVerifier& operator=(const WebhookVerifier&) = delete;

  // The event, when the request is a webhook of the scheme signed by one of
  // the secrets. kInvalidArgument: not a webhook of the scheme (what is
  // missing or malformed is named). kRejected: the signature does not
  // verify, or the timestamp is out of tolerance (which, by how much).
  Result<WebhookEvent> Verify(const Request& request) const;

  const Options& options() const { return options_; }

 private:
  struct Keys;
  WebhookVerifier(Options options, std::unique_ptr<Keys> keys);
  Options options_;
  std::unique_ptr<Keys> keys_;
};

// Counters of a receiver (a point-in-time copy).
struct WebhookCounters {
  uint64_t applied = 0;        // events handled (or enqueued) now
  uint64_t replayed = 0;       // deliveries of an event handled before: 200, nothing run
  uint64_t conflicts = 0;      // an id seen before with another body: 422
  uint64_t malformed = 0;      // 400
  uint64_t unverified = 0;     // 401
  uint64_t in_progress = 0;    // 429
  uint64_t rejected = 0;       // the handler said Status::Rejected: dead-lettered, 200
  uint64_t failed = 0;         // 500
  uint64_t group_commits = 0;  // transactions that handled a group (group_commit_max > 1)
  uint64_t grouped = 0;        // deliveries those transactions handled
  uint64_t stopped = 0;        // 503 after Stop(): nothing stored
};

class WebhookReceiver {
 public:
  struct Options {
    WebhookVerifier::Options verify{};
    // The consumer name of the events' markers. Default: "webhooks".
    std::string consumer = "webhooks";
    // How long markers are kept (Purge). Default: 7 days.
    int64_t retention_ms = 7LL * 24 * 3600 * 1000;
    // Where the enqueue form publishes (Publisher::Publish's destination;
    // "" for the publisher's own).
    std::string destination{};
    // Optional: told each delivery's outcome (as the Inbox tells it).
    Observer* observer = nullptr;
    // Group commit: deliveries that arrive while one transaction commits
    // are handled together in the next one (Inbox::HandleBatch: one commit,
    // one disk sync, for up to this many events), so the sync's cost is
    // shared by the senders waiting on it. Each is still answered only after
    // its own marker committed; a handler that fails costs the others
    // nothing (the group runs again without it). 0 or 1: each delivery in
    // its own transaction. Handlers then run on whichever request thread
    // commits the group, one group at a time: keep them short.
    int group_commit_max = 0;
  };
  // Runs `handler` once per event id, in the transaction that inserts the
  // event's marker; the message it gets has the event id as its id, the raw
  // body as its payload, and headers "webhook-type" (when the scheme names
  // one) and "webhook-timestamp". `store` must outlive the receiver.
  static Result<std::unique_ptr<WebhookReceiver>> Open(Store& store, Handler handler, const Options& options);
  // The call-first form (idem/call_first.h): calls no transaction covers.
  static Result<std::unique_ptr<WebhookReceiver>> Open(Store& store, CallFirst handler, const Options& options);
  // Puts each new event on `publisher` (the same message as above) before
  // its marker commits, then answers 200: a consumer of that queue runs the
  // work (with an Inbox of its own: a crash between the publish and the
  // marker's commit may publish an event twice, with the same id).
  static Result<std::unique_ptr<WebhookReceiver>> Open(Store& store, Publisher& publisher, const Options& options);
  // Detaches StopOnSignals if it names this receiver.
  ~WebhookReceiver();
  WebhookReceiver(const WebhookReceiver&) = delete;
  WebhookReceiver& operator=(const WebhookReceiver&) = delete;

  // Verifies, deduplicates and handles one delivery (the answers above).
  Answer Handle(const Request& request);
  // Stops taking deliveries, for a graceful shutdown: from now on a
  // delivery that verifies is answered 503 with Retry-After (nothing stored:
  // the sender retries, here after a restart or at another instance), and
  // those already being handled finish. Async-signal-safe; any thread.
  void Stop() noexcept;
  bool stopping() const noexcept;
  // Deletes the markers older than Options::retention_ms; how many.
  Result<int64_t> Purge();
  WebhookCounters counters() const;
  const WebhookVerifier& verifier() const { return *verifier_; }

 private:
  struct State;
  explicit WebhookReceiver(std::unique_ptr<State> state, std::unique_ptr<WebhookVerifier> verifier);
  // The receiver of either form (a handler, or a CallFirst when given).
  static Result<std::unique_ptr<WebhookReceiver>> Make(Store& store, const Options& options, Handler handler,
                                                       std::optional<CallFirst> call_first);
  std::unique_ptr<State> state_;
  std::unique_ptr<WebhookVerifier> verifier_;
};

// Signs as a sender would, for tests and for `idem webhooks sign`: the
// headers of a delivery of `body` with event id `id` at `timestamp_s`, signed
// with `secret` (HMAC schemes only: "whsec_..." for kStandard). kInvalidArgument
// for a malformed secret or a scheme that needs a private key.
Result<Headers> SignWebhook(WebhookScheme scheme, std::string_view secret, std::string_view id, int64_t timestamp_s,
                            std::string_view body);

}  // namespace idem::http

namespace idem {
// Makes SIGINT and SIGTERM call receiver->Stop() (idem/signals.h: other
// objects attached, such as the HTTP server in front of it, stop too; the
// handlers before the first attach come back when the last one is
// detached). Pass nullptr to detach every object; the receiver's destructor
// detaches it.
void StopOnSignals(http::WebhookReceiver* receiver);
}  // namespace idem

#endif  // IDEM_HTTP_WEBHOOK_H_
