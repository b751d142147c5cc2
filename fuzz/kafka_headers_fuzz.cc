// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// A Kafka record as kafka::Source reads it (kafka_internal::DecodeRecord):
// headers with any names and values (or none), made with librdkafka's own
// header list, any key and value.
// Input, in lines: the key ("" for none; a first byte '+' also takes the id
// from the key), the value, then one header per line: NAME=VALUE, or NAME
// alone for a header without a value. A name is a C string (up to a NUL).
// Properties: every header is delivered, in order, with its value; the id
// is the first idem-id header, else the key when asked.
#include <librdkafka/rdkafka.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kafka/decode.h"

namespace {

std::string_view Line(std::string_view& in) {
  const size_t nl = in.find('\n');
  std::string_view line = in.substr(0, nl);
  in = nl == std::string_view::npos ? std::string_view() : in.substr(nl + 1);
  return line;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  std::string_view key = Line(in);
  const bool id_from_key = key.starts_with('+');
  if (id_from_key) key.remove_prefix(1);
  const std::string_view value = Line(in);
  rd_kafka_headers_t* hdrs = rd_kafka_headers_new(8);
  std::vector<std::pair<std::string, std::optional<std::string>>> sent;
  while (!in.empty() && sent.size() < 64) {
    const std::string_view line = Line(in);
    const size_t eq = line.find('=');
    std::string name(line.substr(0, eq));
    name = name.substr(0, name.find('\0'));
    std::optional<std::string> v;
    if (eq != std::string_view::npos) v = std::string(line.substr(eq + 1));
    rd_kafka_header_add(hdrs, name.data(), static_cast<ssize_t>(name.size()), v ? v->data() : nullptr,
                        v ? static_cast<ssize_t>(v->size()) : 0);
    sent.emplace_back(std::move(name), std::move(v));
  }
  const idem::kafka_internal::RecordParts parts{
      .payload = value.data(), .len = value.size(), .key = key.empty() ? nullptr : key.data(), .key_len = key.size()};
  const idem::Message m = idem::kafka_internal::DecodeRecord(hdrs, parts, "idem-id", id_from_key);
  rd_kafka_headers_destroy(hdrs);
  if (m.payload != value || m.headers.size() != sent.size()) __builtin_trap();
  std::optional<std::string> id;
  for (size_t i = 0; i < sent.size(); ++i) {
    if (m.headers[i].first != sent[i].first || m.headers[i].second != sent[i].second.value_or("")) __builtin_trap();
    if (!id && sent[i].first == "idem-id") id = sent[i].second.value_or("");
  }
  if (!id && id_from_key && !key.empty()) id = std::string(key);
  if (m.id != id.value_or("")) __builtin_trap();
  return 0;
}
