// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem::redis::StreamPublisher, and the entry format it shares with
// StreamSource::Publish (redis/stream_wire.h).
#include "idem/redis/stream_publisher.h"

#include <utility>
#include <vector>

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

Result<std::string> StreamAppend(Conn& conn, std::string_view stream, std::string_view id_field,
                                 std::string_view payload_field, const Message& m) {
  if (Status s = ValidateId(m.id); !s.ok()) return s.WithContext("publish to stream " + std::string(stream));
  const std::string time = m.producer_time_ms ? std::to_string(*m.producer_time_ms) : std::string();
  std::vector<std::string> names;  // "header:<name>", kept alive for the views
  names.reserve(m.headers.size());
  for (const auto& h : m.headers) names.push_back(std::string(kStreamHeaderPrefix) + h.first);
  std::vector<std::string_view> argv{"XADD", stream, "*", id_field, m.id};
  if (m.producer_time_ms) {
    argv.push_back(kProducerTimeHeader);
    argv.push_back(time);
  }
  argv.push_back(payload_field);
  argv.push_back(m.payload);
  for (size_t i = 0; i < m.headers.size(); ++i) {
    argv.push_back(names[i]);
    argv.push_back(m.headers[i].second);
  }
  IDEM_ASSIGN_OR_RETURN(ReplyPtr r, conn.Command(argv));
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
  Status Publish(const Message& m) override { return Append(m).status(); }

 private:
  const Options o_;
  redis_internal::Pool pool_;
};

}  // namespace

Result<std::unique_ptr<StreamPublisher>> StreamPublisher::Open(const Options& options) {
  Options o = options;
  if (o.stream.empty()) return Status::InvalidArgument("Redis stream publisher: stream is empty");
  IDEM_RETURN_IF_ERROR(redis_internal::CheckStreamField("id_field", o.id_field));
  IDEM_RETURN_IF_ERROR(redis_internal::CheckStreamField("payload_field", o.payload_field));
  if (o.id_field == o.payload_field)
    return Status::InvalidArgument("Redis stream publisher: id_field and payload_field must differ");
  if (o.connect_timeout_ms < 1 || o.connect_timeout_ms > 3'600'000)
    return Status::InvalidArgument("Redis stream publisher: connect_timeout_ms must be 1..3600000, got " +
                                   std::to_string(o.connect_timeout_ms));
  if (o.pool_size < 1) o.pool_size = 1;
  IDEM_ASSIGN_OR_RETURN(redis_internal::Endpoint ep, redis_internal::ParseUrl(o.url));
  redis_internal::Pool::Options po;
  po.size = o.pool_size;
  po.connect.connect_timeout_ms = static_cast<int>(o.connect_timeout_ms);
  auto pub = std::make_unique<StreamPublisherImpl>(std::move(o), std::move(ep), po);
  IDEM_RETURN_IF_ERROR(pub->Connect());
  return std::unique_ptr<StreamPublisher>(std::move(pub));
}

Result<StreamPublisher::Options> StreamPublisher::ParseUrl(std::string_view url) {
  IDEM_ASSIGN_OR_RETURN(StreamSource::Options s, StreamSource::ParseUrl(url));
  return Options{.url = s.url,
                 .stream = s.stream,
                 .id_field = s.id_field,
                 .payload_field = s.payload_field,
                 .pool_size = s.pool_size,
                 .connect_timeout_ms = s.connect_timeout_ms};
}

}  // namespace idem::redis
