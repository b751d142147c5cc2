// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// kafka::Source: a consumer-group member that commits each partition's
// acknowledged prefix (receipts, rebalances, seeks back on nacks, the keeper).
#include "idem/kafka/source.h"

#include <librdkafka/rdkafka.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "core/options_check.h"
#include "kafka/conn.h"
#include "kafka/decode.h"
#include "kafka/errors.h"

namespace idem::kafka {

using kafka_internal::CheckBrokers;
using kafka_internal::ConfPtr;
using kafka_internal::ErrorPtr;
using kafka_internal::ListPtr;
using kafka_internal::MessagePtr;
using kafka_internal::NewList;
using kafka_internal::RkPtr;
using kafka_internal::Set;
using kafka_internal::SteadyMs;
using kafka_internal::Translate;

namespace {

bool ParseInt(std::string_view s, int64_t* out) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size();
}

}  // namespace

// ---------------------------------------------------------------------------
// Receipts: "kafka:<assignment>:<partition>:<offset>:<topic>", the topic last
// so that it may hold any bytes.
// ---------------------------------------------------------------------------

std::string EncodeReceipt(const Receipt& r) {
  return "kafka:" + std::to_string(r.assignment) + ":" + std::to_string(r.partition) + ":" + std::to_string(r.offset) +
         ":" + r.topic;
}

Result<Receipt> DecodeReceipt(std::string_view s) {
  auto bad = [&] { return Status::InvalidArgument("kafka: not a kafka receipt: \"" + std::string(s) + "\""); };
  if (s.substr(0, 6) != "kafka:") return bad();
  s.remove_prefix(6);
  int64_t fields[3];
  for (int64_t& f : fields) {
    size_t colon = s.find(':');
    if (colon == std::string_view::npos || !ParseInt(s.substr(0, colon), &f) || f < 0) return bad();
    s.remove_prefix(colon + 1);
  }
  if (s.empty() || fields[1] > INT32_MAX) return bad();
  return Receipt{std::string(s), static_cast<int32_t>(fields[1]), fields[2], static_cast<uint64_t>(fields[0])};
}

// ---------------------------------------------------------------------------
// Source
// ---------------------------------------------------------------------------

struct Source::Impl {
  enum class State { kWorking, kNacked, kAcked };
  // One assigned partition of the topic.
  struct Part {
    uint64_t assignment = 0;
    // Offsets delivered and not yet committed past, with their state.
    std::map<int64_t, State> inflight;
    // The highest offset delivered, -1 before the first.
    int64_t high = -1;
    // The offset last committed (the next to read), or where this assignment
    // began delivering; -1 before the first delivery.
    int64_t committed = -1;
    // A seek back requested by nacks: to this offset, once due (env clock).
    std::optional<int64_t> seek_offset;
    int64_t seek_due_ms = 0;
  };

  // A record the keeper polled while its partition was being paused: handed
  // out by the next Receive, unless the partition's assignment changed.
  struct Stashed {
    MessagePtr m;
    uint64_t assignment;
  };

  Options o;
  RkPtr rk;
  std::mutex poll_mu;  // one poll at a time (Receive's or the keeper's)
  // Under poll_mu: what the keeper polled and paused, for the next Receive.
  std::deque<Stashed> stash;
  std::vector<int32_t> paused;
  // The keeper (Options::keep_alive): polls with the partitions paused while
  // deliveries are being handled and no Receive polls.
  std::thread keeper;
  std::mutex keeper_mu;
  std::condition_variable keeper_cv;
  bool keeper_stop = false;              // under keeper_mu
  std::atomic<int64_t> last_poll_ms{0};  // steady clock
  std::atomic<uint64_t> keep_alive_polls{0};
  mutable std::mutex mu;
  std::condition_variable cv;  // an in-flight delivery was settled
  std::map<int32_t, Part> parts;
  uint64_t next_assignment = 0;
  bool closing = false;
  std::atomic<uint64_t> delivered{0}, held_back{0}, seeks{0}, commits{0}, commit_errors{0}, assignments{0},
      revocations{0}, abandoned{0};

  // Drops the acknowledged prefix of `p` and returns the offset to commit:
  // the first offset not yet acknowledged, or one past the highest delivered.
  static int64_t Target(Part& p) {
    while (!p.inflight.empty() && p.inflight.begin()->second == State::kAcked) p.inflight.erase(p.inflight.begin());
    return p.inflight.empty() ? p.high + 1 : p.inflight.begin()->first;
  }

  // Under mu: issues an asynchronous commit of `p`'s acknowledged prefix when
  // it moved.
  void CommitAsyncLocked(int32_t partition, Part& p) {
    if (p.high < 0) return;
    const int64_t target = Target(p);
    if (target <= p.committed) return;
    ListPtr list = NewList(1);
    rd_kafka_topic_partition_list_add(list.get(), o.topic.c_str(), partition)->offset = target;
    // Issued under mu so that commits of one partition are queued in
    // increasing order.
    rd_kafka_resp_err_t err = rd_kafka_commit(rk.get(), list.get(), 1);
    commits.fetch_add(1, std::memory_order_relaxed);
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      commit_errors.fetch_add(1, std::memory_order_relaxed);
      return;  // committed stays: the next ack tries again
    }
    p.committed = target;
  }

  void OnAssign(rd_kafka_topic_partition_list_t* list) {
    assignments.fetch_add(1, std::memory_order_relaxed);
    for (int i = 0; i < list->cnt; ++i) {
      rd_kafka_topic_partition_t& tp = list->elems[i];
      if (o.topic != tp.topic) continue;
      if (o.start_offset) {
        if (std::optional<int64_t> start = o.start_offset(o.topic, tp.partition)) tp.offset = *start;
      }
      std::lock_guard<std::mutex> l(mu);
      Part& p = parts[tp.partition];
      p = Part{};
      p.assignment = ++next_assignment;
    }
  }

  // `lost`: the group already gave the partitions away (no commit possible).
  void OnRevoke(rd_kafka_topic_partition_list_t* list, bool lost) {
    revocations.fetch_add(1, std::memory_order_relaxed);
    std::vector<int32_t> revoked;
    for (int i = 0; i < list->cnt; ++i)
      if (o.topic == list->elems[i].topic) revoked.push_back(list->elems[i].partition);
    std::unique_lock<std::mutex> l(mu);
    auto working = [&] {
      for (int32_t partition : revoked) {
        auto it = parts.find(partition);
        if (it == parts.end()) continue;
        for (auto& [offset, state] : it->second.inflight)
          if (state == State::kWorking) return true;
      }
      return false;
    };
    // Let work in progress finish (its ack then commits below), within bounds.
    if (!lost && !closing && o.revoke_wait_ms > 0)
      cv.wait_for(l, std::chrono::milliseconds(o.revoke_wait_ms), [&] { return !working(); });
    ListPtr commit = NewList(static_cast<int>(revoked.size()));
    for (int32_t partition : revoked) {
      auto it = parts.find(partition);
      if (it == parts.end()) continue;
      Part& p = it->second;
      const int64_t target = Target(p);
      // Always, even when `committed` says it was: an earlier commit may have
      // been overtaken by an older one (CommitSync) or lost.
      if (p.high >= 0) rd_kafka_topic_partition_list_add(commit.get(), o.topic.c_str(), partition)->offset = target;
      for (auto& [offset, state] : p.inflight)
        if (state != State::kAcked) abandoned.fetch_add(1, std::memory_order_relaxed);
      parts.erase(it);
    }
    l.unlock();
    // A member that has not polled for max.poll.interval.ms (a handler that
    // long with keep_alive off) has left the group: it can commit nothing,
    // and librdkafka 2.0 never answers a synchronous commit made while such
    // a member closes (an asynchronous one trips its assertion that no
    // commit is in flight at the end). Its successor starts from the last
    // commit made while it was a member.
    if (!lost && SteadyMs() - last_poll_ms.load(std::memory_order_relaxed) >= o.max_poll_interval_ms) {
      lost = true;
      commit_errors.fetch_add(1, std::memory_order_relaxed);
    }
    if (!lost && commit->cnt > 0) {
      commits.fetch_add(1, std::memory_order_relaxed);
      if (rd_kafka_commit(rk.get(), commit.get(), 0) != RD_KAFKA_RESP_ERR_NO_ERROR)
        commit_errors.fetch_add(1, std::memory_order_relaxed);
    }
  }

  static void RebalanceCb(rd_kafka_t* rk, rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t* list,
                          void* opaque) {
    auto* self = static_cast<Impl*>(opaque);
    const char* protocol = rd_kafka_rebalance_protocol(rk);
    const bool cooperative = protocol != nullptr && std::strcmp(protocol, "COOPERATIVE") == 0;
    if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
      self->OnAssign(list);
      if (cooperative) {
        ErrorPtr e(rd_kafka_incremental_assign(rk, list));
      } else {
        rd_kafka_assign(rk, list);
      }
      return;
    }
    self->OnRevoke(list, err != RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS || rd_kafka_assignment_lost(rk));
    if (cooperative) {
      ErrorPtr e(rd_kafka_incremental_unassign(rk, list));
    } else {
      rd_kafka_assign(rk, nullptr);
    }
  }

  static void OffsetCommitCb(rd_kafka_t*, rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t* list,
                             void* opaque) {
    auto* self = static_cast<Impl*>(opaque);
    if (err == RD_KAFKA_RESP_ERR_NO_ERROR || err == RD_KAFKA_RESP_ERR__NO_OFFSET) return;
    self->commit_errors.fetch_add(1, std::memory_order_relaxed);
    // Let the next ack commit these offsets again: lower `committed` below a
    // failed offset that is still the latest one issued.
    std::lock_guard<std::mutex> l(self->mu);
    for (int i = 0; list != nullptr && i < list->cnt; ++i) {
      const rd_kafka_topic_partition_t& tp = list->elems[i];
      if (self->o.topic != tp.topic) continue;
      auto it = self->parts.find(tp.partition);
      if (it != self->parts.end() && it->second.committed == tp.offset) it->second.committed = tp.offset - 1;
    }
  }

  // Performs the seeks back whose delay is over.
  void SeekDue() {
    const int64_t now = o.env->NowMs();
    ListPtr list = NewList(4);
    {
      std::lock_guard<std::mutex> l(mu);
      for (auto& [partition, p] : parts) {
        if (!p.seek_offset || p.seek_due_ms > now) continue;
        rd_kafka_topic_partition_list_add(list.get(), o.topic.c_str(), partition)->offset = *p.seek_offset;
        p.seek_offset.reset();
      }
    }
    if (list->cnt == 0) return;
    seeks.fetch_add(static_cast<uint64_t>(list->cnt), std::memory_order_relaxed);
    ErrorPtr e(rd_kafka_seek_partitions(rk.get(), list.get(), 5'000));
    // A seek that failed is requested again (the partition may be between
    // fetch states); one whose partition is gone is simply dropped.
    std::lock_guard<std::mutex> l(mu);
    for (int i = 0; i < list->cnt; ++i) {
      const rd_kafka_topic_partition_t& tp = list->elems[i];
      if (!e && tp.err == RD_KAFKA_RESP_ERR_NO_ERROR) continue;
      auto it = parts.find(tp.partition);
      if (it == parts.end()) continue;
      Part& p = it->second;
      if (!p.seek_offset || *p.seek_offset > tp.offset) p.seek_offset = tp.offset;
      p.seek_due_ms = std::max(p.seek_due_ms, now);
    }
  }

  // Turns a record into a delivery, or nullopt when it is held back.
  // `fetched_in`: the assignment it was polled in (a stashed record), which
  // must still be the partition's.
  std::optional<Delivery> Take(const rd_kafka_message_t* m, std::optional<uint64_t> fetched_in = std::nullopt) {
    const char* topic = rd_kafka_topic_name(m->rkt);
    if (o.topic != topic) return std::nullopt;
    uint64_t assignment = 0;
    {
      std::lock_guard<std::mutex> l(mu);
      auto it = parts.find(m->partition);
      if (it == parts.end()) return std::nullopt;  // fetched before a revocation
      Part& p = it->second;
      if (fetched_in && *fetched_in != p.assignment) return std::nullopt;  // the same

      if (p.seek_offset && m->offset >= *p.seek_offset) {
        // A nack asked to go back to an earlier offset: this record comes
        // again after the seek.
        held_back.fetch_add(1, std::memory_order_relaxed);
        return std::nullopt;
      }
      auto [e, inserted] = p.inflight.try_emplace(m->offset, State::kWorking);
      if (!inserted && e->second != State::kAcked) e->second = State::kWorking;
      p.high = std::max(p.high, m->offset);
      if (p.committed < 0) p.committed = m->offset;
      assignment = p.assignment;
    }
    Delivery d;
    d.receipt = EncodeReceipt({o.topic, m->partition, m->offset, assignment});
    rd_kafka_headers_t* hdrs = nullptr;
    if (rd_kafka_message_headers(m, &hdrs) != RD_KAFKA_RESP_ERR_NO_ERROR) hdrs = nullptr;
    d.message = kafka_internal::DecodeRecord(
        hdrs, {.payload = m->payload, .len = m->len, .key = m->key, .key_len = m->key_len}, o.id_header, o.id_from_key);
    delivered.fetch_add(1, std::memory_order_relaxed);
    return d;
  }

  // One poll, counted as the member's sign of life.
  MessagePtr Poll(int timeout_ms) {
    MessagePtr m(rd_kafka_consumer_poll(rk.get(), timeout_ms));
    last_poll_ms.store(SteadyMs(), std::memory_order_relaxed);
    return m;
  }

  // Whether a delivery is being worked on (handed out, not yet settled).
  bool Working() const {
    std::lock_guard<std::mutex> l(mu);
    for (const auto& [partition, p] : parts)
      for (const auto& [offset, state] : p.inflight)
        if (state == State::kWorking) return true;
    return false;
  }

  // Under poll_mu: pauses the assigned partitions not paused yet.
  void PauseAssigned() {
    ListPtr list = NewList(4);
    {
      std::lock_guard<std::mutex> l(mu);
      for (const auto& [partition, p] : parts) {
        if (std::find(paused.begin(), paused.end(), partition) != paused.end()) continue;
        rd_kafka_topic_partition_list_add(list.get(), o.topic.c_str(), partition);
        paused.push_back(partition);
      }
    }
    if (list->cnt > 0) (void)rd_kafka_pause_partitions(rk.get(), list.get());
  }

  // Under poll_mu (Receive): resumes what the keeper paused. A partition
  // revoked meanwhile is left alone (its next assignment starts unpaused).
  void ResumePaused() {
    if (paused.empty()) return;
    ListPtr list = NewList(static_cast<int>(paused.size()));
    {
      std::lock_guard<std::mutex> l(mu);
      for (int32_t partition : paused)
        if (parts.count(partition) > 0) rd_kafka_topic_partition_list_add(list.get(), o.topic.c_str(), partition);
    }
    paused.clear();
    if (list->cnt > 0) (void)rd_kafka_resume_partitions(rk.get(), list.get());
  }

  // Under poll_mu: the keeper's turn. The partitions are paused first, so
  // that polling fetches nothing new; a record that was fetched already is
  // stashed for the next Receive; a rebalance runs here as it would in
  // Receive (its callbacks), and a newly assigned partition is paused too.
  void PollPaused() {
    PauseAssigned();
    for (int i = 0; i < 10'000; ++i) {
      MessagePtr m = Poll(0);
      if (!m) break;
      PauseAssigned();
      if (m->err != RD_KAFKA_RESP_ERR_NO_ERROR || m->rkt == nullptr || o.topic != rd_kafka_topic_name(m->rkt))
        continue;  // errors are retried inside librdkafka; Receive reports lasting ones
      std::optional<uint64_t> assignment;
      {
        std::lock_guard<std::mutex> l(mu);
        if (auto it = parts.find(m->partition); it != parts.end()) assignment = it->second.assignment;
      }
      if (assignment) stash.push_back(Stashed{std::move(m), *assignment});
    }
    keep_alive_polls.fetch_add(1, std::memory_order_relaxed);
  }

  // The keeper's thread: wakes every `every` ms; when deliveries are being
  // worked on and nothing polled for that long, polls (PollPaused), so that
  // max.poll.interval.ms never runs out under a long handler.
  void KeepAlive(int64_t every) {
    std::unique_lock<std::mutex> l(keeper_mu);
    while (!keeper_stop) {
      keeper_cv.wait_for(l, std::chrono::milliseconds(every));
      if (keeper_stop) break;
      if (SteadyMs() - last_poll_ms.load(std::memory_order_relaxed) < every || !Working()) continue;
      std::unique_lock<std::mutex> poll(poll_mu, std::try_to_lock);
      if (!poll.owns_lock()) continue;  // a Receive is polling
      l.unlock();
      PollPaused();
      poll.unlock();
      l.lock();
    }
  }

  void StopKeeper() {
    {
      std::lock_guard<std::mutex> l(keeper_mu);
      keeper_stop = true;
    }
    keeper_cv.notify_all();
    if (keeper.joinable()) keeper.join();
  }

  // Finds the delivery's partition under mu; kLeaseLost when it was revoked.
  Result<Part*> Find(const Receipt& r) {
    if (r.topic != o.topic)
      return Status::InvalidArgument("kafka: receipt of topic \"" + r.topic + "\", this source reads \"" + o.topic +
                                     "\"");
    auto it = parts.find(r.partition);
    if (it == parts.end() || it->second.assignment != r.assignment)
      return Status::LeaseLost("kafka: partition " + o.topic + "/" + std::to_string(r.partition) +
                               " was revoked since offset " + std::to_string(r.offset) +
                               " was delivered; its next owner gets it again");
    return &it->second;
  }
};

Source::Source(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Source::~Source() {
  if (!impl_ || !impl_->rk) return;
  impl_->StopKeeper();
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    impl_->closing = true;
  }
  {
    std::lock_guard<std::mutex> l(impl_->poll_mu);
    // Runs the revocation: acknowledged prefixes are committed.
    rd_kafka_consumer_close(impl_->rk.get());
    impl_->stash.clear();  // its records belong to rk
  }
  impl_->rk.reset();
}

Result<std::unique_ptr<Source>> Source::Open(const Options& opts) {
  Options options = opts;
  using options_internal::AtLeast;
  using options_internal::InRange;
  using options_internal::NotEmpty;
  constexpr std::string_view kWhat = "kafka source";
  for (auto [name, v] : {std::pair<const char*, int64_t>{"session_timeout_ms", options.session_timeout_ms},
                         {"heartbeat_interval_ms", options.heartbeat_interval_ms},
                         {"max_poll_interval_ms", options.max_poll_interval_ms}})
    IDEM_RETURN_IF_ERROR(InRange(kWhat, name, v, 1, INT32_MAX));
  IDEM_RETURN_IF_ERROR(AtLeast(kWhat, "revoke_wait_ms", options.revoke_wait_ms, 0));
  IDEM_RETURN_IF_ERROR(AtLeast(kWhat, "connect_timeout_ms", options.connect_timeout_ms, 0));
  IDEM_RETURN_IF_ERROR(NotEmpty(kWhat, "brokers", options.brokers));
  IDEM_RETURN_IF_ERROR(NotEmpty(kWhat, "topic", options.topic));
  IDEM_RETURN_IF_ERROR(NotEmpty(kWhat, "group", options.group));
  if (options.id_header.empty() && !options.id_from_key)
    return options_internal::Refuse(kWhat, "id_header", "given when id_from_key is off (no message id otherwise)",
                                    "an empty string");
  if (options.env == nullptr) options.env = Env::Default();
  auto impl = std::make_unique<Impl>();
  impl->o = std::move(options);
  const Options& o = impl->o;

  ConfPtr conf(rd_kafka_conf_new());
  const std::pair<std::string, std::string> base[] = {
      {"bootstrap.servers", o.brokers},
      {"group.id", o.group},
      {"client.id", o.client_id},
      {"session.timeout.ms", std::to_string(o.session_timeout_ms)},
      {"heartbeat.interval.ms", std::to_string(o.heartbeat_interval_ms)},
      {"max.poll.interval.ms", std::to_string(o.max_poll_interval_ms)},
      {"auto.offset.reset", o.auto_offset_reset},
      {"enable.partition.eof", "false"},
  };
  for (const auto& [k, v] : base) IDEM_RETURN_IF_ERROR(Set(conf.get(), k, v));
  for (const auto& [k, v] : o.config) IDEM_RETURN_IF_ERROR(Set(conf.get(), k, v));
  // Offsets move only when the work is committed: never on their own.
  IDEM_RETURN_IF_ERROR(Set(conf.get(), "enable.auto.commit", "false"));
  IDEM_RETURN_IF_ERROR(Set(conf.get(), "enable.auto.offset.store", "false"));
  rd_kafka_conf_set_rebalance_cb(conf.get(), &Impl::RebalanceCb);
  rd_kafka_conf_set_offset_commit_cb(conf.get(), &Impl::OffsetCommitCb);
  rd_kafka_conf_set_opaque(conf.get(), impl.get());

  char errstr[512];
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf.get(), errstr, sizeof errstr);
  if (rk == nullptr) return Status::InvalidArgument(std::string("kafka: creating the consumer: ") + errstr);
  (void)conf.release();  // owned by rk now
  impl->rk.reset(rk);
  rd_kafka_poll_set_consumer(rk);
  // Before subscribing: a consumer that never joined closes at once.
  if (o.connect_timeout_ms > 0) IDEM_RETURN_IF_ERROR(CheckBrokers(rk, o.brokers, o.connect_timeout_ms));

  ListPtr topics = NewList(1);
  rd_kafka_topic_partition_list_add(topics.get(), o.topic.c_str(), RD_KAFKA_PARTITION_UA);
  if (Status s = Translate(rd_kafka_subscribe(rk, topics.get()), "subscribing to " + o.topic); !s.ok()) {
    rd_kafka_consumer_close(rk);
    return s;
  }
  impl->last_poll_ms = SteadyMs();
  if (o.keep_alive) {
    // Wakes a few times per max.poll.interval.ms: acts only after a quarter
    // of it without a poll.
    const int64_t every = std::max<int64_t>(10, o.max_poll_interval_ms / 4);
    Impl* self = impl.get();
    impl->keeper = std::thread([self, every] { self->KeepAlive(every); });
  }
  return std::unique_ptr<Source>(new Source(std::move(impl)));
}

Result<std::vector<Delivery>> Source::Receive(int max, int64_t wait_ms) {
  if (max < 1) return Status::InvalidArgument("kafka: Receive needs max >= 1, not " + std::to_string(max));
  Impl& s = *impl_;
  std::lock_guard<std::mutex> poll_lock(s.poll_mu);
  std::vector<Delivery> out;
  // What the keeper paused goes on; what it polled comes first, in order.
  s.ResumePaused();
  while (!s.stash.empty() && static_cast<int>(out.size()) < max) {
    Impl::Stashed st = std::move(s.stash.front());
    s.stash.pop_front();
    if (std::optional<Delivery> d = s.Take(st.m.get(), st.assignment)) out.push_back(std::move(*d));
  }
  if (!s.stash.empty()) return out;
  const int64_t deadline = SteadyMs() + std::max<int64_t>(0, wait_ms);
  while (static_cast<int>(out.size()) < max) {
    s.SeekDue();
    const int64_t left = deadline - SteadyMs();
    // Poll in slices, so that a seek falling due during the wait is made.
    const int timeout = out.empty() ? static_cast<int>(std::clamp<int64_t>(left, 0, 100)) : 0;
    MessagePtr m = s.Poll(timeout);
    if (!m) {
      if (!out.empty() || SteadyMs() >= deadline) break;
      continue;
    }
    if (m->err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) continue;
      char fatal[256];
      rd_kafka_resp_err_t ferr = rd_kafka_fatal_error(s.rk.get(), fatal, sizeof fatal);
      if (ferr != RD_KAFKA_RESP_ERR_NO_ERROR) {
        if (!out.empty()) break;
        return Status::Internal(std::string("kafka: fatal consumer error: ") + rd_kafka_err2name(ferr) + ": " + fatal);
      }
      Status st = Translate(m->err, "consuming " + s.o.topic);
      // Transport and broker trouble is retried inside librdkafka; a
      // configuration problem (unknown topic, no authorisation) is the
      // caller's to see.
      if (st.code() == Code::kInvalidArgument) {
        if (!out.empty()) break;
        return st;
      }
      continue;
    }
    if (std::optional<Delivery> d = s.Take(m.get())) out.push_back(std::move(*d));
  }
  return out;
}

Status Source::Ack(const Delivery& delivery) {
  Impl& s = *impl_;
  IDEM_ASSIGN_OR_RETURN(Receipt r, DecodeReceipt(delivery.receipt));
  std::lock_guard<std::mutex> l(s.mu);
  IDEM_ASSIGN_OR_RETURN(Impl::Part * p, s.Find(r));
  if (auto it = p->inflight.find(r.offset); it != p->inflight.end()) it->second = Impl::State::kAcked;
  s.cv.notify_all();
  s.CommitAsyncLocked(r.partition, *p);
  return Status::OK();
}

Status Source::Nack(const Delivery& delivery, int64_t delay_ms) {
  Impl& s = *impl_;
  IDEM_ASSIGN_OR_RETURN(Receipt r, DecodeReceipt(delivery.receipt));
  const int64_t due = s.o.env->NowMs() + std::max<int64_t>(0, delay_ms);
  std::lock_guard<std::mutex> l(s.mu);
  IDEM_ASSIGN_OR_RETURN(Impl::Part * p, s.Find(r));
  auto it = p->inflight.find(r.offset);
  if (it == p->inflight.end() || it->second == Impl::State::kAcked) return Status::OK();  // done already
  it->second = Impl::State::kNacked;
  if (!p->seek_offset || r.offset < *p->seek_offset) p->seek_offset = r.offset;
  p->seek_due_ms = std::max(p->seek_due_ms, due);
  s.cv.notify_all();
  return Status::OK();
}

Status Source::CommitSync() {
  Impl& s = *impl_;
  ListPtr list = NewList(4);
  {
    std::lock_guard<std::mutex> l(s.mu);
    for (auto& [partition, p] : s.parts) {
      if (p.high < 0) continue;
      rd_kafka_topic_partition_list_add(list.get(), s.o.topic.c_str(), partition)->offset = Impl::Target(p);
    }
  }
  if (list->cnt == 0) return Status::OK();
  s.commits.fetch_add(1, std::memory_order_relaxed);
  Status st = Translate(rd_kafka_commit(s.rk.get(), list.get(), 0), "committing offsets of " + s.o.topic);
  if (!st.ok()) {
    s.commit_errors.fetch_add(1, std::memory_order_relaxed);
    return st;
  }
  std::lock_guard<std::mutex> l(s.mu);
  for (int i = 0; i < list->cnt; ++i) {
    auto it = s.parts.find(list->elems[i].partition);
    if (it != s.parts.end()) it->second.committed = std::max(it->second.committed, list->elems[i].offset);
  }
  return Status::OK();
}

Result<RedeliveryHorizon> Source::Horizon() {
  Impl& s = *impl_;
  const int timeout = 5'000;
  // The topic's partitions, the group's committed offsets and the ends of
  // the log: what lies between a committed offset and the end may still be
  // delivered, to this member or another.
  ListPtr parts = NewList(8);
  {
    const rd_kafka_metadata_t* md = nullptr;
    std::unique_ptr<rd_kafka_topic_t, void (*)(rd_kafka_topic_t*)> topic(
        rd_kafka_topic_new(s.rk.get(), s.o.topic.c_str(), nullptr), rd_kafka_topic_destroy);
    IDEM_RETURN_IF_ERROR(Translate(rd_kafka_metadata(s.rk.get(), 0, topic.get(), &md, timeout),
                                   "reading the partitions of " + s.o.topic));
    for (int t = 0; t < md->topic_cnt; ++t)
      for (int p = 0; p < md->topics[t].partition_cnt; ++p)
        rd_kafka_topic_partition_list_add(parts.get(), s.o.topic.c_str(), md->topics[t].partitions[p].id);
    rd_kafka_metadata_destroy(md);
  }
  IDEM_RETURN_IF_ERROR(Translate(rd_kafka_committed(s.rk.get(), parts.get(), timeout),
                                 "reading the committed offsets of group " + s.o.group));
  // The first record not committed of each partition that has one.
  ListPtr start = NewList(parts->cnt);
  for (int i = 0; i < parts->cnt; ++i) {
    const rd_kafka_topic_partition_t& tp = parts->elems[i];
    int64_t low = 0, high = 0;
    IDEM_RETURN_IF_ERROR(
        Translate(rd_kafka_query_watermark_offsets(s.rk.get(), s.o.topic.c_str(), tp.partition, &low, &high, timeout),
                  "reading the log ends of " + s.o.topic + "/" + std::to_string(tp.partition)));
    // No commit yet: the group starts where auto.offset.reset says.
    int64_t from = tp.offset >= 0 ? tp.offset : s.o.auto_offset_reset == "earliest" ? low : high;
    from = std::max(from, low);  // below the log's start: deleted by retention, never delivered again
    if (from < high) rd_kafka_topic_partition_list_add(start.get(), s.o.topic.c_str(), tp.partition)->offset = from;
  }
  if (start->cnt == 0) return RedeliveryHorizon::None();
  // Their timestamps, read by a consumer of its own that joins no group.
  ConfPtr conf(rd_kafka_conf_new());
  for (const auto& [k, v] : s.o.config) (void)Set(conf.get(), k, v);
  IDEM_RETURN_IF_ERROR(Set(conf.get(), "bootstrap.servers", s.o.brokers));
  IDEM_RETURN_IF_ERROR(Set(conf.get(), "group.id", s.o.group + ".idem-horizon"));
  IDEM_RETURN_IF_ERROR(Set(conf.get(), "enable.auto.commit", "false"));
  IDEM_RETURN_IF_ERROR(Set(conf.get(), "enable.partition.eof", "false"));
  char errstr[512];
  RkPtr probe(rd_kafka_new(RD_KAFKA_CONSUMER, conf.get(), errstr, sizeof errstr));
  if (!probe) return Status::Internal(std::string("kafka: creating the horizon's reader: ") + errstr);
  (void)conf.release();
  IDEM_RETURN_IF_ERROR(Translate(rd_kafka_assign(probe.get(), start.get()), "reading the first records left"));
  std::map<int32_t, int64_t> first;  // partition -> timestamp of its first record left
  const int64_t deadline = SteadyMs() + timeout;
  while (static_cast<int>(first.size()) < start->cnt && SteadyMs() < deadline) {
    MessagePtr m(rd_kafka_consumer_poll(probe.get(), 100));
    if (!m || m->err != RD_KAFKA_RESP_ERR_NO_ERROR) continue;
    rd_kafka_timestamp_type_t type;
    const int64_t ts = rd_kafka_message_timestamp(m.get(), &type);
    first.try_emplace(m->partition, ts >= 0 ? ts : 0);
  }
  (void)rd_kafka_consumer_close(probe.get());
  if (static_cast<int>(first.size()) < start->cnt)
    return Status::Unavailable("kafka: could not read the first uncommitted record of every partition of " + s.o.topic +
                               " within " + std::to_string(timeout) + " ms");
  int64_t oldest = INT64_MAX;
  for (const auto& [partition, ts] : first) oldest = std::min(oldest, ts);
  return RedeliveryHorizon::At(oldest);
}

std::vector<int32_t> Source::Assignment() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  std::vector<int32_t> out;
  for (const auto& [partition, p] : impl_->parts) out.push_back(partition);
  return out;
}

std::string Source::MemberId() const {
  char* id = rd_kafka_memberid(impl_->rk.get());
  if (id == nullptr) return "";
  std::string out(id);
  rd_kafka_mem_free(impl_->rk.get(), id);
  return out;
}

SourceStats Source::stats() const {
  const Impl& s = *impl_;
  return {s.delivered.load(),   s.held_back.load(),     s.seeks.load(),
          s.commits.load(),     s.commit_errors.load(), s.assignments.load(),
          s.revocations.load(), s.abandoned.load(),     s.keep_alive_polls.load()};
}

}  // namespace idem::kafka
