// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/httplib/middleware.h"

#include <set>
#include <utility>

namespace idem::httplib {
namespace {

// The adapter's validator as the core's, for one request: it sees the
// native request; what it writes becomes the core's answer.
http::Validator NativeValidator(const Validator& validate, const ::httplib::Request& native) {
  if (!validate) return nullptr;
  return [&validate, &native](const http::Request&, http::Answer& ans) {
    ::httplib::Response res;
    const bool ok = validate(native, res);
    ans = ToAnswer(res);
    return ok;
  };
}

Status BothValidators(const std::string& route, const http::RoutePolicy& policy, const Validator& validate) {
  if (validate && policy.validate)
    return Status::InvalidArgument("idem::httplib route " + route +
                                   ": give the validator as policy.validate or as the argument, not both");
  return Status::OK();
}

}  // namespace

http::Request ToRequest(const ::httplib::Request& req) {
  http::Request out{.method = req.method, .path = req.path, .headers = {}, .body = req.body};
  for (const auto& [name, value] : req.headers) out.headers.Add(name, value);
  return out;
}

http::Answer ToAnswer(const ::httplib::Response& res) {
  http::Answer out;
  out.status = res.status < 0 ? 200 : res.status;
  for (const auto& [name, value] : res.headers) out.headers.Add(name, value);
  out.body = res.body;
  return out;
}

void WriteAnswer(const http::Answer& answer, ::httplib::Response& res) {
  res.status = answer.status;
  for (const auto& [name, value] : answer.headers) res.set_header(name, value);
  res.body = answer.body;
}

Result<Handler> Wrap(http::Idempotency& idempotency, std::string route, http::RoutePolicy policy, Handler handler,
                     Validator validate) {
  IDEM_RETURN_IF_ERROR(BothValidators(route, policy, validate));
  std::set<std::string> methods = policy.methods;
  IDEM_ASSIGN_OR_RETURN(const http::Idempotency::Route* r,
                        idempotency.AddRoute(std::move(route), http::RouteKind::kTwoPhase, std::move(policy)));
  return Handler([&idempotency, r, methods = std::move(methods), handler = std::move(handler),
                  validate = std::move(validate)](const ::httplib::Request& native, ::httplib::Response& res) {
    if (!methods.count(native.method)) return handler(native, res);  // not guarded: untouched
    const http::Request req = ToRequest(native);
    http::Answer ans;
    idempotency.Serve(
        *r, req, ans,
        [&](const http::Request&, http::Answer& out, Transaction*) {
          ::httplib::Response written;
          handler(native, written);
          out = ToAnswer(written);
        },
        NativeValidator(validate, native));
    WriteAnswer(ans, res);
  });
}

Result<Handler> WrapInTransaction(http::Idempotency& idempotency, std::string route, http::RoutePolicy policy,
                                  Store& store, TxHandler handler, Validator validate) {
  IDEM_RETURN_IF_ERROR(BothValidators(route, policy, validate));
  IDEM_ASSIGN_OR_RETURN(
      const http::Idempotency::Route* r,
      idempotency.AddRoute(std::move(route), http::RouteKind::kTransactional, std::move(policy), &store));
  return Handler([&idempotency, r, handler = std::move(handler), validate = std::move(validate)](
                     const ::httplib::Request& native, ::httplib::Response& res) {
    const http::Request req = ToRequest(native);
    http::Answer ans;
    idempotency.Serve(
        *r, req, ans,
        [&](const http::Request&, http::Answer& out, Transaction* tx) {
          ::httplib::Response written;
          handler(native, written, *tx);
          out = ToAnswer(written);
        },
        NativeValidator(validate, native));
    WriteAnswer(ans, res);
  });
}

}  // namespace idem::httplib
