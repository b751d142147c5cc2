// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem::http::Client over https against an ::httplib::SSLServer on loopback.
// The certificates are made here, at test time, with OpenSSL's C API: a CA,
// a server certificate it signs for 127.0.0.1 and localhost, and another CA
// that signs nothing the server shows.
#include <gtest/gtest.h>
#include <httplib.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "http/http_test_util.h"
#include "idem/http/client.h"
#include "idem/httplib/gateway.h"
#include "idem/sqlite/store.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

using http::Client;

struct FreeKey {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct FreeCert {
  void operator()(X509* c) const { X509_free(c); }
};
using Key = std::unique_ptr<EVP_PKEY, FreeKey>;
using Cert = std::unique_ptr<X509, FreeCert>;

Key NewKey() { return Key(EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256")); }

bool AddExtension(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  if (ext == nullptr) return false;
  const bool ok = X509_add_ext(cert, ext, -1) == 1;
  X509_EXTENSION_free(ext);
  return ok;
}

// A certificate for `key` named `cn`, signed by `issuer` (self-signed when
// null): a CA, or a server certificate for the names in `san`.
Cert MakeCert(EVP_PKEY* key, const char* cn, X509* issuer, EVP_PKEY* issuer_key, const char* san, long serial) {
  Cert cert(X509_new());
  X509* x = cert.get();
  X509_set_version(x, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(x), serial);
  X509_gmtime_adj(X509_getm_notBefore(x), -3600);
  X509_gmtime_adj(X509_getm_notAfter(x), 24 * 3600);
  X509_set_pubkey(x, key);
  X509_NAME* name = X509_get_subject_name(x);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(cn), -1, -1, 0);
  X509_set_issuer_name(x, issuer != nullptr ? X509_get_subject_name(issuer) : name);
  X509* signer = issuer != nullptr ? issuer : x;
  bool ok = AddExtension(x, signer, NID_subject_key_identifier, "hash");
  if (san == nullptr) {
    ok = ok && AddExtension(x, signer, NID_basic_constraints, "critical,CA:TRUE") &&
         AddExtension(x, signer, NID_key_usage, "critical,keyCertSign,cRLSign");
  } else {
    ok = ok && AddExtension(x, signer, NID_basic_constraints, "CA:FALSE") &&
         AddExtension(x, signer, NID_authority_key_identifier, "keyid") &&
         AddExtension(x, signer, NID_ext_key_usage, "serverAuth") && AddExtension(x, signer, NID_subject_alt_name, san);
  }
  if (!ok || X509_sign(x, issuer_key != nullptr ? issuer_key : key, EVP_sha256()) == 0) return nullptr;
  return cert;
}

bool WritePem(X509* cert, const std::string& path) {
  BIO* bio = BIO_new_file(path.c_str(), "w");
  if (bio == nullptr) return false;
  const bool ok = PEM_write_bio_X509(bio, cert) == 1;
  BIO_free(bio);
  return ok;
}

// A CA with its key.
struct Ca {
  Key key;
  Cert cert;
  std::string pem;  // the certificate's file
};

class ClientTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MakeCa("idem test CA", 1, &ca_);
    MakeCa("another CA", 2, &other_ca_);
  }
  void TearDown() override {
    if (thread_.joinable()) {
      server_->stop();
      thread_.join();
    }
  }

  void MakeCa(const char* cn, long serial, Ca* ca) {
    ca->key = NewKey();
    ASSERT_NE(ca->key, nullptr);
    ca->cert = MakeCert(ca->key.get(), cn, nullptr, nullptr, nullptr, serial);
    ASSERT_NE(ca->cert, nullptr);
    ca->pem = dir_.File(std::string("ca-") + std::to_string(serial) + ".pem");
    ASSERT_TRUE(WritePem(ca->cert.get(), ca->pem));
  }

  // An SSLServer on 127.0.0.1 with a certificate from ca_ for `san` (and
  // common name `cn`, which httplib also accepts as the host's name);
  // POST /v1/charges answers 201 and records the key.
  void Start(const char* san = "IP:127.0.0.1,DNS:localhost", const char* cn = "127.0.0.1") {
    Key key = NewKey();
    ASSERT_NE(key, nullptr);
    Cert cert = MakeCert(key.get(), cn, ca_.cert.get(), ca_.key.get(), san, 100);
    ASSERT_NE(cert, nullptr);
    server_ = std::make_unique<::httplib::SSLServer>(cert.get(), key.get());  // it takes references of its own
    ASSERT_TRUE(server_->is_valid());
    server_->Post("/v1/charges", [this](const ::httplib::Request& req, ::httplib::Response& res) {
      std::lock_guard lock(mu_);
      keys_.push_back(req.get_header_value("Idempotency-Key"));
      res.status = 201;
      res.set_content(R"({"id":"ch_tls"})", "application/json");
    });
    port_ = server_->bind_to_any_port("127.0.0.1");
    ASSERT_GT(port_, 0);
    thread_ = std::thread([this] { server_->listen_after_bind(); });
    while (!server_->is_running()) std::this_thread::yield();
  }

  std::unique_ptr<Client> NewClient(const std::string& ca_file) {
    auto c = Client::Open({.base_url = "https://127.0.0.1:" + std::to_string(port_) + "/v1",
                           .ca_file = ca_file,
                           .max_attempts = 6,
                           .env = &env_});
    EXPECT_OK(c);
    return c.ok() ? std::move(*c) : nullptr;
  }
  std::vector<std::string> keys() {
    std::lock_guard lock(mu_);
    return keys_;
  }

  // A refusal that names certificate verification, was not retried and
  // sent nothing.
  void ExpectRefused(const Result<http::Response>& r, const std::string& why) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Code::kUnavailable) << r.status();
    const std::string& m = r.status().message();
    EXPECT_NE(m.find("certificate verification failed"), std::string::npos) << m;
    EXPECT_NE(m.find(why), std::string::npos) << m;
    EXPECT_NE(m.find("not retried after 1 attempt"), std::string::npos) << m;
    EXPECT_NE(m.find("nothing was sent"), std::string::npos) << m;
    EXPECT_TRUE(env_.sleeps().empty());
    EXPECT_TRUE(keys().empty());
  }

  TempDir dir_;
  HookedEnv env_;
  Ca ca_, other_ca_;
  std::unique_ptr<::httplib::SSLServer> server_;
  std::thread thread_;
  int port_ = 0;
  std::mutex mu_;
  std::vector<std::string> keys_;
};

TEST_F(ClientTlsTest, PostsOverHttpsWithTheRightCa) {
  Start();
  auto client = NewClient(ca_.pem);
  for (int i = 0; i < 2; ++i) {  // the second on the kept-alive connection
    auto r = client->Post("/charges", R"({"amount":4000})", "tls-1");
    ASSERT_OK(r);
    EXPECT_EQ(r->status, 201);
    EXPECT_EQ(r->attempts, 1);
    EXPECT_EQ(r->body, R"({"id":"ch_tls"})");
  }
  EXPECT_EQ(keys(), std::vector<std::string>(2, "\"tls-1\""));
}

TEST_F(ClientTlsTest, AnotherCaIsRefusedAndNotRetried) {
  Start();
  auto client = NewClient(other_ca_.pem);
  ExpectRefused(client->Post("/charges", "{}", "tls-2"), "unable to get local issuer certificate");
}

// idem::httplib::Gateway in front of the https upstream: the certificate is
// verified; one the CA it trusts did not sign is 502 with nothing sent, and
// the key stays free.
TEST_F(ClientTlsTest, TheGatewayVerifiesAnHttpsUpstream) {
  Start();
  auto store = sqlite::Store::Open({.path = dir_.File("gateway.db")});
  ASSERT_OK(store);
  Claims claims(*(*store)->claim_store());
  for (const Ca* trusted : {&other_ca_, &ca_}) {
    auto gateway = idem::httplib::Gateway::Open(
        {.upstream = "https://127.0.0.1:" + std::to_string(port_), .claims = &claims, .ca_file = trusted->pem});
    ASSERT_OK(gateway);
    std::thread serving([&] { (void)(*gateway)->Run(); });
    while (!(*gateway)->server().native().is_running()) std::this_thread::yield();
    ::httplib::Client c("127.0.0.1", (*gateway)->port());
    auto r = c.Post("/v1/charges", {{"Authorization", "Bearer sk_1"}, {"Idempotency-Key", "tls-gw"}},
                    R"({"amount":4000})", "application/json");
    ASSERT_TRUE(r);
    if (trusted == &other_ca_) {
      EXPECT_EQ(r->status, 502) << r->body;
      EXPECT_NE(r->body.find("certificate verification failed"), std::string::npos) << r->body;
      EXPECT_TRUE(keys().empty());
    } else {
      EXPECT_EQ(r->status, 201) << r->body;
      EXPECT_EQ(r->body, R"({"id":"ch_tls"})");
      EXPECT_EQ(keys(), std::vector<std::string>{"tls-gw"});
    }
    (*gateway)->Stop();
    serving.join();
  }
}

// Verification is on by default: the system's CAs do not know the test CA.
TEST_F(ClientTlsTest, TheSystemCasDoNotTrustATestCa) {
  Start();
  auto client = NewClient("");
  ExpectRefused(client->Post("/charges", "{}", "tls-3"), "unable to get local issuer certificate");
}

TEST_F(ClientTlsTest, ACertificateForAnotherHostIsRefused) {
  Start("DNS:example.com", "example.com");
  auto client = NewClient(ca_.pem);
  ExpectRefused(client->Post("/charges", "{}", "tls-4"), "does not name the host");
}

TEST_F(ClientTlsTest, AnUnreadableCaFileIsRefusedAtCreate) {
  auto c = Client::Open({.base_url = "https://127.0.0.1:8443", .ca_file = dir_.File("missing.pem")});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kInvalidArgument);
  EXPECT_NE(c.status().message().find("ca_file"), std::string::npos) << c.status();
}

}  // namespace
}  // namespace idem::testing
