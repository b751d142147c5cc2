// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The live view's events (idem run, relay, provider, demo with --web): a
// Feed is the Observer of the process that serves the page. It keeps the
// running count of each event kind (what the page's counters show) and a
// ring of the latest events, which each page reads at its own pace: a page
// that falls behind skips ahead and is told how many it missed; the process
// never waits for a page.
//
// Cheap when busy: each event is counted (one atomic add); at most
// kKeptPer100Ms events per 100 ms are also kept for the pages (encoded and
// put in the ring), the rest counted as skipped, so a flood costs the
// process next to nothing and the pages say how many they did not see.
//
// Several processes feed one page: each child has a Sender (an Observer
// that writes each event as one datagram to the Feed's unix socket, never
// blocking: a full socket drops the event and counts it), and the Feed
// re-tells what it receives to the observers given to Forward (the
// parent's Metrics), so the page and /metrics count the same events.
//
// The page's protocol (tools/idem/live/index.html, doc/observability.md):
// an event is a JSON object {"seq","at_ms","kind","consumer","who","id",
// "attempt","detail","handler_us","commit_us"} (only seq, at_ms and kind
// always there); kinds are the library's (EventKindName) and the CLI's own
// ("step", "say", "ack_lost", "unguarded_effect", "provider_response_lost",
// "received" for the demo's hand-made deliveries).
#ifndef IDEM_TOOLS_IDEM_LIVE_FEED_H_
#define IDEM_TOOLS_IDEM_LIVE_FEED_H_

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "idem/observer.h"
#include "idem/result.h"
#include "idem/status.h"

namespace idem::cli::live {

// One event of the page's protocol, before the Feed numbers it.
struct Note {
  std::string_view kind;
  std::string_view id;
  std::string_view detail;
  int attempt = 0;
  std::string_view who;       // the process or worker ("consumer-2"); "" for the Feed's own
  std::string_view consumer;  // the consumer's, relay's or scope's name
  int64_t handler_us = -1, commit_us = -1;
  int64_t at_ms = 0;  // 0: now
};

// The JSON object of `n` without its seq (the Feed adds it): the body
// between the braces, e.g. "at_ms":1,"kind":"applied","id":"m-7f3".
std::string EncodeBody(const Note& n);
// An Event of the library as a Note (views into `e`).
Note NoteOf(const Event& e, std::string_view who);

// Where one page is in the feed.
struct Cursor {
  uint64_t next = 0;          // the first event not yet sent
  uint64_t dropped = 0;       // events not sent: behind, coalesced, or skipped by the feed
  uint64_t skipped_seen = 0;  // the feed's skipped count already added to dropped
};

class Feed final : public Observer {
 public:
  static constexpr int64_t kKeptPer100Ms = 500;

  // `process` names the serving process on the page ("idem run").
  explicit Feed(std::string process, size_t ring = 4096);
  ~Feed() override;
  Feed(const Feed&) = delete;
  Feed& operator=(const Feed&) = delete;

  // This process's library events.
  void OnEvent(const Event& event) noexcept override;
  // The CLI's own events (the demo's narration and hand-made steps).
  void Tell(const Note& note);
  void Step(std::string_view title) { Tell({.kind = "step", .detail = title}); }
  void Say(std::string_view line) { Tell({.kind = "say", .detail = line}); }

  // One line a Sender sent: a JSON object of the protocol. A line that is
  // not one is counted (bad_lines) and dropped.
  void Ingest(std::string_view line);
  // Receives Senders' datagrams on a unix socket at `path` (created; an
  // existing file there is replaced), on a thread until the Feed is
  // destroyed. kUnavailable when the socket cannot be made.
  Status Listen(const std::string& path);
  // Every event of the library's kinds (OnEvent, and Tell and Ingest
  // rebuilt as an Event) is also told to `o` (the page's /metrics). Set it
  // before the first event.
  void Forward(Observer* o) { forward_ = o; }

  // {"process","started_ms","now_ms","counts":{kind:n},"recent":[...],"dropped":0}.
  // *cursor (if given): where a page that got it starts.
  std::string Snapshot(Cursor* cursor = nullptr);
  // Waits up to `wait_ms` for events after the cursor, then
  // {"now_ms","counts","events":[...],"dropped":D,"coalesced":C}: at most
  // `max` events, the newest (the older ones are coalesced); those gone
  // from the ring, and those the feed skipped, are dropped. D is the
  // cursor's total. "" when nothing came and `wait_ms` passed (the caller
  // sends a comment).
  std::string Batch(Cursor* cursor, int64_t wait_ms, size_t max);
  // Wakes every Batch waiting (the server stops).
  void Close();

  uint64_t count(std::string_view kind);
  uint64_t bad_lines() const { return bad_lines_.load(); }
  uint64_t skipped() const { return skipped_.load(); }

 private:
  // Counts `kind`; true when the event is also to be kept (the budget; the
  // CLI's own kinds always are).
  bool Count(std::string_view kind);
  bool Count(EventKind kind);
  void Push(std::string_view kind, const std::string& body);
  std::string CountsLocked();

  const std::string process_;
  const size_t ring_size_;
  const int64_t started_ms_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t next_seq_ = 1;
  std::deque<std::pair<uint64_t, std::string>> ring_;    // seq, the whole JSON object
  std::string last_step_;                                // the latest "step" event, kept past the ring
  std::map<std::string, uint64_t, std::less<>> counts_;  // the CLI's own kinds (rare)
  std::array<std::atomic<uint64_t>, kEventKinds> library_counts_{};
  std::atomic<int64_t> budget_{kKeptPer100Ms};
  std::atomic<int64_t> refilled_ms_{0};
  std::atomic<uint64_t> skipped_{0};
  int waiters_ = 0;            // Batch calls waiting (under mu_)
  bool wake_pending_ = false;  // a notify not yet seen by them
  bool closed_ = false;
  Observer* forward_ = nullptr;
  std::atomic<uint64_t> bad_lines_{0};
  // Listen's socket and thread.
  int fd_ = -1;
  std::string path_;
  std::atomic<bool> stop_{false};
  std::thread listener_;
};

// In a process that feeds another's page: every event as one datagram to
// the Feed's socket.
class Sender final : public Observer {
 public:
  // Connects to the Feed's socket at `path`; `who` names this process on the
  // page. kUnavailable when it cannot.
  static Result<std::unique_ptr<Sender>> Open(const std::string& path, std::string who);
  ~Sender() override;
  void OnEvent(const Event& event) noexcept override;
  void Tell(const Note& note) noexcept;
  uint64_t dropped() const { return dropped_.load(); }

 private:
  Sender(int fd, std::string who) : fd_(fd), who_(std::move(who)) {}
  int fd_;
  std::string who_;
  std::atomic<uint64_t> dropped_{0};
};

}  // namespace idem::cli::live

#endif  // IDEM_TOOLS_IDEM_LIVE_FEED_H_
