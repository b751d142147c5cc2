// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "live/feed.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <system_error>

#include "core/json_string.h"

namespace idem::cli::live {

namespace {

int64_t WallMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The library's kind named `name`, if it is one.
std::optional<EventKind> KindNamed(std::string_view name) {
  for (int i = 0;; ++i) {
    const auto k = static_cast<EventKind>(i);
    const std::string_view n = EventKindName(k);
    if (n == "unknown") return std::nullopt;
    if (n == name) return k;
  }
}

sockaddr_un AddressOf(const std::string& path, Status* error) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.size() >= sizeof a.sun_path) {
    *error = Status::InvalidArgument("the live view's socket path is too long (" + std::to_string(path.size()) +
                                     " bytes): " + path);
    return a;
  }
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  return a;
}

}  // namespace

std::string EncodeBody(const Note& n) {
  std::string out = "\"at_ms\":" + std::to_string(n.at_ms > 0 ? n.at_ms : WallMs()) + ",\"kind\":";
  out += internal::JsonString(n.kind);
  auto field = [&](const char* key, std::string_view v) {
    if (v.empty()) return;
    out.append(",\"").append(key).append("\":");
    out += internal::JsonString(v);
  };
  field("consumer", n.consumer);
  field("who", n.who);
  field("id", n.id);
  if (n.attempt > 0) out.append(",\"attempt\":").append(std::to_string(n.attempt));
  field("detail", n.detail);
  if (n.handler_us >= 0) out.append(",\"handler_us\":").append(std::to_string(n.handler_us));
  if (n.commit_us >= 0) out.append(",\"commit_us\":").append(std::to_string(n.commit_us));
  return out;
}

Note NoteOf(const Event& e, std::string_view who) {
  return Note{.kind = EventKindName(e.kind),
              .id = e.message_id,
              .detail = e.detail,
              .attempt = e.attempt,
              .who = who,
              .consumer = e.consumer,
              .handler_us = e.handler_us,
              .commit_us = e.commit_us,
              .at_ms = e.at_ms};
}

Feed::Feed(std::string process, size_t ring) : process_(std::move(process)), ring_size_(ring), started_ms_(WallMs()) {}

Feed::~Feed() {
  Close();
  stop_.store(true);
  if (listener_.joinable()) listener_.join();
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(path_.c_str());
  }
}

bool Feed::Count(std::string_view kind) {
  if (auto k = KindNamed(kind)) return Count(*k);
  std::lock_guard lock(mu_);
  auto it = counts_.find(kind);
  if (it == counts_.end()) it = counts_.emplace(std::string(kind), 0).first;
  ++it->second;
  return true;  // the CLI's own (narration, the demo's steps): always kept
}

bool Feed::Count(EventKind kind) {
  library_counts_[static_cast<size_t>(kind)].fetch_add(1, std::memory_order_relaxed);
  if (budget_.fetch_sub(1, std::memory_order_relaxed) > 0) return true;
  // Out of budget: refilled once 100 ms have passed since the last refill
  // (the clock read at most every 64 events).
  const uint64_t skipped = skipped_.fetch_add(1, std::memory_order_relaxed);
  if (skipped % 64 == 0) {
    const int64_t now = WallMs();
    int64_t last = refilled_ms_.load(std::memory_order_relaxed);
    if (now - last >= 100 && refilled_ms_.compare_exchange_strong(last, now)) budget_.store(kKeptPer100Ms);
  }
  return false;
}

void Feed::Push(std::string_view kind, const std::string& body) {
  std::lock_guard lock(mu_);
  const uint64_t seq = next_seq_++;
  std::string whole = "{\"seq\":" + std::to_string(seq) + "," + body + "}";
  if (kind == "step") last_step_ = whole;
  ring_.emplace_back(seq, std::move(whole));
  while (ring_.size() > ring_size_) ring_.pop_front();
  // A page waits in Batch: wake it once, not once per event.
  if (waiters_ > 0 && !wake_pending_) {
    wake_pending_ = true;
    cv_.notify_all();
  }
}

void Feed::OnEvent(const Event& event) noexcept {
  try {
    if (Count(event.kind)) {
      const Note n = NoteOf(event, {});
      Push(n.kind, EncodeBody(n));
    }
    if (forward_ != nullptr) forward_->OnEvent(event);
  } catch (...) {
    // An observer never throws into the run (std::bad_alloc): the event is lost to the page.
  }
}

void Feed::Tell(const Note& n) {
  if (Count(n.kind)) Push(n.kind, EncodeBody(n));
  if (forward_ == nullptr) return;
  if (auto k = KindNamed(n.kind)) {
    Event e;
    e.kind = *k;
    e.consumer = n.consumer;
    e.message_id = n.id;
    e.attempt = n.attempt;
    e.handler_us = n.handler_us;
    e.commit_us = n.commit_us;
    e.detail = n.detail;
    e.at_ms = n.at_ms;
    forward_->OnEvent(e);
  }
}

void Feed::Ingest(std::string_view line) {
  nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("kind") || !j["kind"].is_string()) {
    bad_lines_.fetch_add(1);
    return;
  }
  auto str = [&](const char* k) { return j.contains(k) && j[k].is_string() ? j[k].get<std::string>() : std::string(); };
  auto num = [&](const char* k, int64_t d) {
    return j.contains(k) && j[k].is_number_integer() ? j[k].get<int64_t>() : d;
  };
  const std::string kind = str("kind"), id = str("id"), detail = str("detail"), who = str("who"),
                    consumer = str("consumer");
  Tell(Note{.kind = kind,
            .id = id,
            .detail = detail,
            .attempt = static_cast<int>(num("attempt", 0)),
            .who = who,
            .consumer = consumer,
            .handler_us = num("handler_us", -1),
            .commit_us = num("commit_us", -1),
            .at_ms = num("at_ms", 0)});
}

Status Feed::Listen(const std::string& path) {
  Status error;
  const sockaddr_un a = AddressOf(path, &error);
  IDEM_RETURN_IF_ERROR(error);
  ::unlink(path.c_str());
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::Unavailable(std::string("cannot make the live view's socket: ") + std::strerror(errno));
  const int buffer = 4 << 20;
  (void)::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer, sizeof buffer);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::Unavailable("cannot bind the live view's socket " + path + ": " + std::strerror(err));
  }
  fd_ = fd;
  path_ = path;
  try {
    listener_ = std::thread([this] {
      std::string buf(64 * 1024, '\0');
      while (!stop_.load()) {
        pollfd p{fd_, POLLIN, 0};
        if (::poll(&p, 1, 100) <= 0) continue;
        const ssize_t n = ::recv(fd_, buf.data(), buf.size(), 0);
        if (n > 0) Ingest(std::string_view(buf.data(), static_cast<size_t>(n)));
      }
    });
  } catch (const std::system_error& e) {
    return Status::Unavailable(std::string("cannot start the live view's socket thread: ") + e.what());
  }
  return Status::OK();
}

std::string Feed::CountsLocked() {
  std::string out = "{";
  auto add = [&](std::string_view kind, uint64_t n) {
    if (out.size() > 1) out += ',';
    out += internal::JsonString(kind);
    out += ':';
    out += std::to_string(n);
  };
  for (size_t k = 0; k < kEventKinds; ++k)
    if (const uint64_t n = library_counts_[k].load(std::memory_order_relaxed); n > 0)
      add(EventKindName(static_cast<EventKind>(k)), n);
  for (const auto& [kind, n] : counts_) add(kind, n);
  return out + "}";
}

std::string Feed::Snapshot(Cursor* cursor) {
  std::lock_guard lock(mu_);
  if (cursor != nullptr) {
    cursor->next = next_seq_;
    cursor->skipped_seen = skipped_.load();
  }
  std::string out = "{\"process\":" + internal::JsonString(process_) +
                    ",\"started_ms\":" + std::to_string(started_ms_) + ",\"now_ms\":" + std::to_string(WallMs()) +
                    ",\"counts\":" + CountsLocked() + ",\"recent\":[";
  constexpr size_t kRecent = 200;
  const size_t from = ring_.size() > kRecent ? ring_.size() - kRecent : 0;
  bool first = true;
  // The current step first when newer events pushed it out of the recent ones.
  bool step_in_recent = last_step_.empty();
  for (size_t i = from; i < ring_.size() && !step_in_recent; ++i) step_in_recent = ring_[i].second == last_step_;
  if (!step_in_recent) {
    out += last_step_;
    first = false;
  }
  for (size_t i = from; i < ring_.size(); ++i) {
    if (!first) out += ',';
    out += ring_[i].second;
    first = false;
  }
  return out + "],\"dropped\":0}";
}

std::string Feed::Batch(Cursor* c, int64_t wait_ms, size_t max) {
  std::unique_lock lock(mu_);
  ++waiters_;
  cv_.wait_for(lock, std::chrono::milliseconds(wait_ms), [&] { return closed_ || next_seq_ > c->next; });
  --waiters_;
  wake_pending_ = false;
  // What the feed skipped since this page last heard: dropped for it too.
  const uint64_t skipped = skipped_.load();
  const uint64_t newly_skipped = skipped - c->skipped_seen;
  c->skipped_seen = skipped;
  c->dropped += newly_skipped;
  if (next_seq_ <= c->next && newly_skipped == 0) return "";
  // Gone from the ring: dropped. More than `max` waiting: the newest are
  // sent, the older ones coalesced.
  if (!ring_.empty() && ring_.front().first > c->next) {
    c->dropped += ring_.front().first - c->next;
    c->next = ring_.front().first;
  }
  const size_t pending = static_cast<size_t>(next_seq_ - c->next);
  const size_t coalesced = pending > max ? pending - max : 0;
  c->next += coalesced;
  c->dropped += coalesced;
  std::string out = "{\"now_ms\":" + std::to_string(WallMs()) + ",\"counts\":" + CountsLocked() + ",\"events\":[";
  const size_t start = ring_.size() - static_cast<size_t>(next_seq_ - c->next);
  for (size_t i = start; i < ring_.size(); ++i) {
    if (i > start) out += ',';
    out += ring_[i].second;
  }
  c->next = next_seq_;
  return out + "],\"dropped\":" + std::to_string(c->dropped) +
         ",\"coalesced\":" + std::to_string(coalesced + newly_skipped) + "}";
}

void Feed::Close() {
  {
    std::lock_guard lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

uint64_t Feed::count(std::string_view kind) {
  if (auto k = KindNamed(kind)) return library_counts_[static_cast<size_t>(*k)].load();
  std::lock_guard lock(mu_);
  auto it = counts_.find(kind);
  return it == counts_.end() ? 0 : it->second;
}

Result<std::unique_ptr<Sender>> Sender::Open(const std::string& path, std::string who) {
  Status error;
  const sockaddr_un a = AddressOf(path, &error);
  IDEM_RETURN_IF_ERROR(error);
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0)
    return Status::Unavailable(std::string("cannot make a socket for the live view: ") + std::strerror(errno));
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::Unavailable("cannot reach the live view's socket " + path + ": " + std::strerror(err));
  }
  return std::unique_ptr<Sender>(new Sender(fd, std::move(who)));
}

Sender::~Sender() { ::close(fd_); }

void Sender::Tell(const Note& note) noexcept {
  try {
    Note n = note;
    if (n.who.empty()) n.who = who_;
    const std::string line = "{" + EncodeBody(n) + "}";
    if (::send(fd_, line.data(), line.size(), MSG_DONTWAIT | MSG_NOSIGNAL) < 0) dropped_.fetch_add(1);
  } catch (...) {
    dropped_.fetch_add(1);
  }
}

void Sender::OnEvent(const Event& event) noexcept { Tell(NoteOf(event, who_)); }

}  // namespace idem::cli::live
