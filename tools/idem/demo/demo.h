// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem demo: the seed's four steps, done for real on SQLite and the embedded
// queue, each outcome read back from the databases; then why the marker and
// the work must share one transaction, shown by crashing child processes at
// named kill points; then a larger run with competing consumer processes and
// injected faults, checked against the expected totals. The payment provider
// is a real HTTP server on loopback (ProviderServer, its own SQLite file),
// called with idem::http::Client and the key DownstreamKey(message, "charge").
//
// The parts of the command (internal to it):
//   demo.h         this: the run's settings and what every part uses
//   common.cc      the narrative, a step's files, queue and store, the provider
//   story.cc       steps 1 to 4 and the crash scenarios
//   larger_run.cc  the consumer processes, the shipping stage, the totals
//   on_source.cc   the run on a broker (--source)
//   command.cc     the flags, the live view (--web), the JSON object
#ifndef IDEM_TOOLS_IDEM_DEMO_DEMO_H_
#define IDEM_TOOLS_IDEM_DEMO_DEMO_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "cli.h"
#include "idem/embedded/queue.h"
#include "idem/observer.h"
#include "idem/source.h"
#include "idem/store.h"
#include "live/feed.h"
#include "provider_server.h"

namespace idem::cli::demo {

struct Config {
  std::string dir;
  int64_t messages = 10'000;
  int consumers = 4;
  int64_t lease_ms = 500;
  double dup_rate = 0.05;
  double lost_ack_rate = 0.03;
  double stall_rate = 0.002;
  double lost_response_rate = 0.02;
  uint64_t seed = 1;
  bool json = false;
  bool story = true;
};

// The demo's consumer names, distinct from anything a user keeps in a shared
// PostgreSQL database; each step starts by clearing what they left. The
// second stage: the shipping consumer.
inline constexpr const char* kConsumer = "idem-demo";
inline constexpr const char* kShippingConsumer = "idem-demo-shipping";

// --web: the live view's feed, and how long each line of the story stays
// on screen before the next step (a person's pace); none without --web.
struct LiveDemo {
  live::Feed* feed = nullptr;
  int64_t pace_ms = 0;
  std::string socket;  // the feed's socket, for the consumer processes
};
extern LiveDemo g_live;

// The store: "" for a SQLite file in each step's directory, or --store.
extern std::string g_store_url;

// One event of the demo's own (a hand-made delivery, a lost ack) to the page.
// (The payments consumer's, unless it names another.)
void Show(live::Note note);

// Tags the library's events with the consumer (process or thread) they came
// from, for the page's lanes.
class Tagged final : public Observer {
 public:
  explicit Tagged(std::string who) : who_(std::move(who)) {}
  void OnEvent(const Event& e) noexcept override {
    if (g_live.feed == nullptr) return;
    try {
      g_live.feed->Tell(live::NoteOf(e, who_));
    } catch (...) {
    }
  }

 private:
  std::string who_;
};

// Prints the narrative unless --json (`quiet`), and tells it to the live view.
struct Out {
  bool quiet = false;
  void operator()(const std::string& line) const;
};

std::string Dollars(int64_t cents);
std::string Mark(bool good);  // ✓ or ✕

// Removes `path` and its SQLite -wal and -shm files (absent ones are fine).
Status RemoveDbFiles(const std::string& path);

// One step's files, in a directory of its own.
struct Files {
  std::string dir, queue, store, provider, shipping;
};
Result<Files> MakeFiles(const std::string& root, const std::string& name);

struct Parts {
  std::unique_ptr<embedded::Queue> queue;
  std::unique_ptr<Store> store;
};
// Opens the step's queue and store; `fresh` first clears what an earlier
// step or run left in a shared store.
Result<Parts> OpenParts(const Files& f, int64_t lease_ms, bool fresh = false);

// Waits for the next delivery (a redelivery appears once a lease expires),
// received by consumer `who` (the live view's lane).
Result<Delivery> Next(Source& q, const char* who = "consumer", int64_t wait_ms = 5'000);

struct Totals {
  int64_t rows = 0, cents = 0;
};
// The payment rows of `order` ("" for every order) and their sum.
Result<Totals> PaymentsFor(Store& store, const std::string& order);

// Starts the payment provider on 127.0.0.1 (any free port) on a fresh SQLite
// file of its own at `path` (charges and idempotency records). When
// `lose_response(key)` says true, the provider keeps the charge and its
// stored response but drops the connection.
Result<std::unique_ptr<ProviderServer>> StartProvider(const std::string& path, int threads,
                                                      std::function<bool(const std::string&)> lose_response,
                                                      std::function<void(const std::string&)> log = nullptr);
// POST /charges requests the provider received, replays included.
int64_t ProviderCalls(const ProviderServer& provider);

// The parts, in the order the command runs them.

// Steps 1 to 4 and the crash scenarios (story.cc): false when an outcome is
// not the one the story tells; what they found is added to `story`.
Result<bool> RunStory(const Config& cfg, const Out& say, Json& story);

// The larger run (larger_run.cc): its JSON object, and whether every total
// is the expected one.
struct RunResult {
  Json json;
  bool ok = false;
};
Result<RunResult> LargerRun(const Config& cfg, const Out& say);

// `idem demo --source URL` (on_source.cc): an exit code.
int RunDemoOnSource(const Config& cfg, const std::string& source_url, const Out& say);

}  // namespace idem::cli::demo

#endif  // IDEM_TOOLS_IDEM_DEMO_DEMO_H_
