// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem::redis::StreamPublisher, and the entry format it shares with
// StreamSource::Publish (redis/stream_wire.h).
#include "idem/redis/stream_publisher.h"

#include <utility>
#include <vector>

#include "core/options_check.h"
#include "core/publish_batch.h"
#include "core/wire_format.h"
#include "idem/redis/stream_source.h"
#include "redis/client.h"
#include "redis/stream_wire.h"

namespace idem::redis_internal {

Status CheckStreamField(std::string_view what, std::string_view field) {
  if (field.empty()) return Status::InvalidArgument("Redis stream: " + std::string(what) + " is empty");
  if (wire_internal::ProducerTimeRank(field) >= 0 || field.starts_with(kStreamHeaderPrefix))
    return Status::InvalidArgument("Redis stream: " + std::string(what) + ": the field '" + std::string(field) +
                                   "' is reserved (" + std::string(kProducerTimeHeader) +
                                   ", producer_time_ms, header:<name>)");
  return Status::OK();
}

StreamEntry::StreamEntry(std::string_view stream, std::string_view id_field, std::string_view payload_field,
                         const Message& m, std::string_view key) {
  // The strings the views point into live in names_'s one buffer (reserved
  // once, never reallocated), which a move hands over as it is.
  names_.reserve(m.headers.size() + 2);
  argv_ = {"XADD", stream, "*", id_field, m.id};
  if (m.producer_time_ms) {
    names_.push_back(std::to_string(*m.producer_time_ms));
    argv_.push_back(kProducerTimeHeader);
    argv_.push_back(names_.back());
  }
  const size_t first_header = names_.size();
  for (const auto& h : m.headers) names_.push_back(std::string(kStreamHeaderPrefix) + h.first);
  argv_.push_back(payload_field);
  argv_.push_back(m.payload);
  for (size_t i = 0; i < m.headers.size(); ++i) {
    argv_.push_back(names_[first_header + i]);
    argv_.push_back(m.headers[i].second);
  }
  if (!key.empty()) {
    names_.push_back(std::string(kStreamHeaderPrefix) + std::string(kOrderingKeyHeader));
    argv_.push_back(names_.back());
    argv_.push_back(key);
  }
}

Result<std::string> StreamAppend(Conn& conn, std::string_view stream, std::string_view id_field,
                                 std::string_view payload_field, const Message& m) {
  if (Status s = ValidateId(m.id); !s.ok()) return s.WithContext("publish to stream " + std::string(stream));
  StreamEntry e(stream, id_field, payload_field, m, {});
  IDEM_ASSIGN_OR_RETURN(ReplyPtr r, conn.Command(e.argv()));
  return std::string(ReplyString(r.get()));
}

}  // namespace idem::redis_internal

namespace idem::redis {
namespace {

class StreamPublisherImpl final : public StreamPublisher {
 public:
  StreamPublisherImpl(Options o, redis_internal::Endpoint ep, redis_internal::Pool::Options po)
      : o_(std::move(o)), pool_(std::move(ep), std::move(po)) {}

  Status Connect() { return pool_.Take().status(); }

  Result<std::string> Append(const Message& m) override {
    IDEM_ASSIGN_OR_RETURN(auto conn, pool_.Take());
    return redis_internal::StreamAppend(*conn, o_.stream, o_.id_field, o_.payload_field, m);
  }
  Status Publish(const Message& m) override {
    if (o_.stream.empty()) return publish_internal::NoChannel("Redis stream", "stream");
    return Append(m).status();
  }

  // Every XADD on one connection, pipelined: one round trip, one reply each.
  std::vector<Status> PublishBatch(std::span<const Outgoing> batch) override {
    std::vector<Status> out(batch.size());
    std::vector<redis_internal::StreamEntry> entries;
    std::vector<size_t> sent;  // the element of each entry
    entries.reserve(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      auto d = publish_internal::Destination(batch[i], o_.stream, "Redis stream", "stream");
      if (!d.ok()) {
        out[i] = d.status();
        continue;
      }
      entries.emplace_back(*d, o_.id_field, o_.payload_field, *batch[i].message, batch[i].key);
      sent.push_back(i);
    }
    if (entries.empty()) return out;
    auto conn = pool_.Take();
    if (!conn.ok()) {
      for (size_t i : sent) out[i] = conn.status();
      return out;
    }
    size_t appended = 0;
    Status failed;
    for (; appended < entries.size() && failed.ok(); ++appended) failed = (*conn)->Append(entries[appended].argv());
    if (!failed.ok()) --appended;  // that one was not queued
    // Read every reply queued: an error reply is its element's; a broken
    // connection leaves the rest unknown (the Pool drops it: unhealthy).
    for (size_t k = 0; k < appended; ++k) {
      auto r = (*conn)->Read("XADD");
      out[sent[k]] = r.status();
      if (!r.ok() && !(*conn)->healthy()) {
        for (size_t j = k; j < appended; ++j) out[sent[j]] = r.status();
        appended = k;
        break;
      }
    }
    for (size_t k = appended; k < entries.size(); ++k)
      if (out[sent[k]].ok()) out[sent[k]] = failed.ok() ? Status::Unavailable("Redis: connection lost") : failed;
    return out;
  }

  PublisherTraits traits() const override { return {.ordered_batch = false, .max_batch = 500}; }
  std::string_view Channel() const override { return o_.stream; }

 private:
  const Options o_;
  redis_internal::Pool pool_;
};

}  // namespace

Result<std::unique_ptr<StreamPublisher>> StreamPublisher::Open(const Options& options) {
  Options o = options;
  IDEM_RETURN_IF_ERROR(redis_internal::CheckStreamField("id_field", o.id_field));
  IDEM_RETURN_IF_ERROR(redis_internal::CheckStreamField("payload_field", o.payload_field));
  if (o.id_field == o.payload_field)
    return Status::InvalidArgument("Redis stream publisher: id_field and payload_field must differ");
  constexpr std::string_view kWhat = "Redis stream publisher";
  IDEM_RETURN_IF_ERROR(options_internal::InRange(kWhat, "connect_timeout_ms", o.connect_timeout_ms, 1, 3'600'000));
  IDEM_RETURN_IF_ERROR(options_internal::AtLeast(kWhat, "pool_size", o.pool_size, 1));
  IDEM_ASSIGN_OR_RETURN(redis_internal::Endpoint ep, redis_internal::ParseUrl(o.url));
  redis_internal::Pool::Options po;
  po.size = o.pool_size;
  po.connect.connect_timeout_ms = static_cast<int>(o.connect_timeout_ms);
  auto pub = std::make_unique<StreamPublisherImpl>(std::move(o), std::move(ep), po);
  IDEM_RETURN_IF_ERROR(pub->Connect());
  return std::unique_ptr<StreamPublisher>(std::move(pub));
}

Result<StreamPublisher::Options> StreamPublisher::ParseUrl(std::string_view url) {
  IDEM_ASSIGN_OR_RETURN(StreamSource::Options s, redis_internal::ParseStreamUrl(url, /*need_stream=*/false));
  return Options{.url = s.url,
                 .stream = s.stream,
                 .id_field = s.id_field,
                 .payload_field = s.payload_field,
                 .pool_size = s.pool_size,
                 .connect_timeout_ms = s.connect_timeout_ms};
}

}  // namespace idem::redis
