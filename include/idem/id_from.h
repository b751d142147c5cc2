// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// IdFrom: where a message's id comes from when the producer put it in the
// payload or in a header of its own rather than in the source's id field
// (the seed's preferred id is a business key: "order 1042"). The Consumer
// (Consumer::Options::id_from, `idem run --id-from`) sets each delivery's
// id from it before the Inbox sees the message, on every source.
//
//   auto from = idem::IdFrom::Parse("json:/order/id");               // {"order": {"id": "1042"}} -> "1042"
//   auto both = idem::IdFrom::Parse("json:/tenant+json:/invoice/number");  // "acme:in_77" (joined by ':')
//   auto hdr  = idem::IdFrom::Parse("header:X-Order-Id");
//   idem::Result<std::string> id = from->Extract(message);
//
// A part is "json:<JSON pointer>" (RFC 6901: "/order/id", "/items/0/sku",
// "~1" for '/', "~0" for '~'; the value a string or an integer) or
// "header:<name>" (the message's first header of that name, any case). A
// composite joins its parts' values with ':' in order, each value's '\' and
// ':' escaped with a '\' ("a:b" + "c" gives "a\:b:c", "a" + "b:c" gives
// "a:b\:c"), so different values never give one id. A single part is its
// value as it is. A message without one of them gets kRejected naming the part:
// the Consumer dead-letters it at once (reason "rejected"), since no
// redelivery can give it an id.
//
// Thread safety: immutable after Parse; Extract may be called from many
// threads.
#ifndef IDEM_ID_FROM_H_
#define IDEM_ID_FROM_H_

#include <string>
#include <string_view>
#include <vector>

#include "idem/message.h"
#include "idem/result.h"

namespace idem {

class IdFrom {
 public:
  // kInvalidArgument naming what is wrong: an empty spec or part, an unknown
  // kind (not json: or header:), a JSON pointer not starting with '/', a
  // bad '~' escape, an empty header name.
  static Result<IdFrom> Parse(std::string_view spec);

  // The id for `message`: kRejected when the payload is not JSON, or a part
  // is missing, null, not a string or integer, or empty; kInvalidArgument
  // when the id is not a valid id (ValidateId: too long).
  Result<std::string> Extract(const Message& message) const;

  // The spec, as Parse read it.
  const std::string& spec() const { return spec_; }

 private:
  struct Part {
    bool json = true;
    std::string name{};                 // the header's name, or the pointer as given
    std::vector<std::string> tokens{};  // the pointer's reference tokens, unescaped
  };
  std::string spec_;
  std::vector<Part> parts_;
};

}  // namespace idem

#endif  // IDEM_ID_FROM_H_
