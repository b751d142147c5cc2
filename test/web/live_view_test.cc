// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The live view in a real browser: Debian's headless Chromium, driven over
// the W3C WebDriver protocol by chromedriver, opens the page `idem demo
// --web` serves while the demo runs (the seed's steps, then the larger run
// with its consumer processes feeding the parent's page). It checks that the
// page loads with no console errors, that a duplicate delivery shows as
// skipped and a lost ack as a redelivery, that the page's counters agree
// with the process's /metrics during the run and after it, and that a page
// opened late starts from the same counts. Its screenshots are the ones in
// doc/ (IDEM_LIVE_SCREENSHOTS names the folder they are written to).
//
// Environment: IDEM_BINARY (the idem command), IDEM_WEB_PORT and
// IDEM_CHROMEDRIVER_PORT (the first ports tried on 127.0.0.1, set by CMake:
// each takes the first free one from there on).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <openssl/evp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "util/test_servers.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

using nlohmann::json;

std::string Env(const char* name, const char* fallback = "") {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : fallback;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A child process, its output in a file; SIGTERM then SIGKILL by its PID at
// the end.
class Child {
 public:
  Child(std::vector<std::string> args, std::string out) : out_(std::move(out)) {
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      const int fd = ::open(out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        ::dup2(fd, STDOUT_FILENO);
        ::dup2(fd, STDERR_FILENO);
      }
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
  }
  ~Child() { Stop(); }
  bool Running() { return pid_ > 0 && ::waitpid(pid_, &status_, WNOHANG) == 0; }
  std::string Output() const { return ReadFile(out_); }
  // SIGTERM, then SIGKILL after 10 s; the wait status.
  int Stop() {
    if (pid_ <= 0) return status_;
    ::kill(pid_, SIGTERM);
    if (!WaitFor([&] { return ::waitpid(pid_, &status_, WNOHANG) == pid_; }, 10'000)) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status_, 0);
    }
    pid_ = -1;
    return status_;
  }

 private:
  std::string out_;
  pid_t pid_ = -1;
  int status_ = 0;
};

// The W3C WebDriver protocol, the few calls this test needs.
class Browser {
 public:
  explicit Browser(int port) : http_("127.0.0.1", port) { http_.set_read_timeout(60, 0); }
  bool Start() {
    json caps = {{"capabilities",
                  {{"alwaysMatch",
                    {{"browserName", "chrome"},
                     {"goog:chromeOptions",
                      {{"binary", Env("IDEM_CHROMIUM", "/usr/bin/chromium")},
                       {"args",
                        {"--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--window-size=1280,860", "--hide-scrollbars"}}}},
                     {"goog:loggingPrefs", {{"browser", "ALL"}}}}}}}};
    json r = Call("POST", "/session", caps);
    if (!r.contains("value") || !r["value"].contains("sessionId")) {
      ADD_FAILURE() << "chromedriver gave no session: " << r.dump();
      return false;
    }
    session_ = r["value"]["sessionId"].get<std::string>();
    return true;
  }
  ~Browser() {
    if (!session_.empty()) Call("DELETE", "/session/" + session_, nullptr);
  }
  void Go(const std::string& url) { Call("POST", Path("/url"), {{"url", url}}); }
  // Runs `script` (a function body) in the page; its return value.
  json Eval(const std::string& script) {
    json r = Call("POST", Path("/execute/sync"), {{"script", script}, {"args", json::array()}});
    return r.contains("value") ? r["value"] : json();
  }
  // The browser's console and errors since the last call.
  std::vector<std::string> Severe() {
    json r = Call("POST", Path("/se/log"), {{"type", "browser"}});
    std::vector<std::string> out;
    if (r.contains("value") && r["value"].is_array())
      for (const json& e : r["value"])
        if (e.value("level", "") == "SEVERE" || e.value("level", "") == "WARNING")
          out.push_back(e.value("message", std::string()));
    return out;
  }
  // The viewport as a PNG file.
  bool Screenshot(const std::string& path) {
    json r = Call("GET", Path("/screenshot"), nullptr);
    if (!r.contains("value") || !r["value"].is_string()) return false;
    const std::string b64 = r["value"].get<std::string>();
    std::string png(b64.size() * 3 / 4 + 3, '\0');
    const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(png.data()),
                                  reinterpret_cast<const unsigned char*>(b64.data()), static_cast<int>(b64.size()));
    if (n < 0) return false;
    size_t len = static_cast<size_t>(n);
    for (size_t i = b64.size(); i > 0 && b64[i - 1] == '='; --i) --len;  // DecodeBlock counts the padding
    std::ofstream(path, std::ios::binary).write(png.data(), static_cast<std::streamsize>(len));
    return true;
  }

 private:
  std::string Path(const std::string& tail) const { return "/session/" + session_ + tail; }
  json Call(const std::string& method, const std::string& path, const json& body) {
    httplib::Result r = method == "GET"      ? http_.Get(path.c_str())
                        : method == "DELETE" ? http_.Delete(path.c_str())
                                             : http_.Post(path.c_str(), body.dump(), "application/json");
    if (!r) return json();
    return json::parse(r->body, nullptr, /*allow_exceptions=*/false);
  }
  httplib::Client http_;
  std::string session_;
};

// Sums of the Prometheus text's counters, by metric name (every label set).
std::map<std::string, long long> Sums(const std::string& text) {
  std::map<std::string, long long> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t name_end = line.find_first_of("{ ");
    const size_t value_at = line.rfind(' ');
    if (name_end == std::string::npos || value_at == std::string::npos) continue;
    out[line.substr(0, name_end)] += std::atoll(line.c_str() + value_at + 1);
  }
  return out;
}

class LiveViewTest : public ::testing::Test {
 protected:
  void SetUp() override {
    idem_ = Env("IDEM_BINARY");
    ASSERT_FALSE(idem_.empty()) << "IDEM_BINARY is not set";
    web_port_ = idem::testing::FirstFreePort(std::atoi(Env("IDEM_WEB_PORT", "28431").c_str()));
    driver_port_ = idem::testing::FirstFreePort(
        std::max(web_port_ + 1, std::atoi(Env("IDEM_CHROMEDRIVER_PORT", "28432").c_str())));
    std::printf("live view on 127.0.0.1:%d, chromedriver on 127.0.0.1:%d\n", web_port_, driver_port_);
    shots_ = Env("IDEM_LIVE_SCREENSHOTS", dir_.path().c_str());
    driver_ = std::make_unique<Child>(std::vector<std::string>{Env("IDEM_CHROMEDRIVER", "/usr/bin/chromedriver"),
                                                               "--port=" + std::to_string(driver_port_)},
                                      dir_.File("chromedriver.log"));
    httplib::Client status("127.0.0.1", driver_port_);
    ASSERT_TRUE(WaitFor(
        [&] {
          auto r = status.Get("/status");
          return r && r->body.find("\"ready\":true") != std::string::npos;
        },
        30'000))
        << "chromedriver did not start: " << driver_->Output();
  }

  std::string Base() const { return "http://127.0.0.1:" + std::to_string(web_port_); }
  std::string Get(const std::string& path) {
    httplib::Client c("127.0.0.1", web_port_);
    auto r = c.Get(path.c_str());
    return r ? r->body : std::string();
  }
  // The page's counts (window.idemLive.counts), as name -> n.
  static std::map<std::string, long long> PageCounts(Browser& b) {
    std::map<std::string, long long> out;
    json v = b.Eval("return window.idemLive ? window.idemLive.counts : null;");
    if (v.is_object())
      for (auto it = v.begin(); it != v.end(); ++it)
        if (it->is_number()) out[it.key()] = it->get<long long>();
    return out;
  }

  TempDir dir_;
  std::string idem_, shots_;
  int web_port_ = 0, driver_port_ = 0;
  std::unique_ptr<Child> driver_;
};

TEST_F(LiveViewTest, TheDemoPlaysInTheBrowserAndItsCountersAgreeWithMetrics) {
  Child demo({idem_, "demo", "--dir", dir_.File("demo"), "--web", "127.0.0.1:" + std::to_string(web_port_), "--pace",
              "150ms", "--messages", "2000", "--consumers", "3"},
             dir_.File("demo.log"));
  ASSERT_TRUE(WaitFor([&] { return Get("/state").find("\"process\"") != std::string::npos; }, 30'000)) << demo.Output();

  Browser browser(driver_port_);
  ASSERT_TRUE(browser.Start());
  browser.Go(Base() + "/");
  ASSERT_TRUE(
      WaitFor([&] { return browser.Eval("return !!(window.idemLive && window.idemLive.connected);") == true; }, 20'000))
      << "the page did not connect to /events";

  // Step 1's lost ack brings m-7f3 back: a redelivery; step 3's redelivery
  // hits the marker: skipped.
  auto has = [&](const std::string& selector, const std::string& text) {
    return browser.Eval("return Array.from(document.querySelectorAll('" + selector +
                        "')).some(e => e.textContent.includes('" + text + "'));") == true;
  };
  EXPECT_TRUE(WaitFor([&] { return has("#log li.kind-ack_lost", "ack lost"); }, 60'000)) << demo.Output();
  EXPECT_TRUE(WaitFor([&] { return has("#log li.kind-received.redelivered", "redelivered"); }, 60'000));
  EXPECT_TRUE(WaitFor([&] { return has("#log li.kind-duplicate", "skipped"); }, 60'000));
  EXPECT_TRUE(browser.Screenshot(shots_ + "/live-story.png"));
  EXPECT_TRUE(WaitFor([&] { return has("#log li.kind-claim_replayed", ""); }, 60'000)) << "step 4's replay";
  EXPECT_TRUE(browser.Screenshot(shots_ + "/live-provider.png"));

  // During the larger run: the page never counts more than /metrics (it
  // reads the same events a little later), and both grow.
  ASSERT_TRUE(WaitFor([&] { return PageCounts(browser)["applied"] > 20; }, 120'000)) << demo.Output();
  for (int sample = 0; sample < 5 && demo.Running(); ++sample) {
    const auto page = PageCounts(browser);
    const auto metrics = Sums(Get("/metrics"));
    EXPECT_LE(page.at("applied"), metrics.at("idem_applied_total"));
    EXPECT_LE(page.at("received"), metrics.at("idem_received_total"));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  EXPECT_TRUE(browser.Screenshot(shots_ + "/live-run.png"));

  // After the run (the demo stays up): the same counts on the page and in
  // /metrics, to the message.
  ASSERT_TRUE(WaitFor([&] { return demo.Output().find("stays up") != std::string::npos; }, 240'000)) << demo.Output();
  EXPECT_NE(demo.Output().find("every total as expected"), std::string::npos) << demo.Output();
  const auto metrics = Sums(Get("/metrics"));
  const std::pair<const char*, const char*> pairs[] = {{"applied", "idem_applied_total"},
                                                       {"duplicate", "idem_duplicates_total"},
                                                       {"received", "idem_received_total"},
                                                       {"acked", "idem_acked_total"},
                                                       {"claim_replayed", "idem_claims_replayed_total"},
                                                       {"outbox_added", "idem_outbox_added_total"}};
  EXPECT_TRUE(WaitFor(
      [&] {
        const auto page = PageCounts(browser);
        for (const auto& [kind, metric] : pairs)
          if (!page.count(kind) || page.at(kind) != metrics.at(metric)) return false;
        return true;
      },
      20'000));
  const auto page = PageCounts(browser);
  for (const auto& [kind, metric] : pairs) {
    EXPECT_GT(metrics.at(metric), 0) << metric;
    EXPECT_EQ(page.count(kind) ? page.at(kind) : -1, metrics.at(metric)) << kind;
    // The counters shown are the counts.
    EXPECT_EQ(browser.Eval(std::string("const e = document.getElementById('count-") + kind +
                           "'); return e ? e.textContent.trim() : null;"),
              std::to_string(metrics.at(metric)))
        << kind;
  }
  EXPECT_TRUE(browser.Screenshot(shots_ + "/live-done.png"));

  // A page opened late starts from the same counts.
  browser.Go(Base() + "/");
  EXPECT_TRUE(WaitFor([&] { return PageCounts(browser)["applied"] == metrics.at("idem_applied_total"); }, 20'000));
  EXPECT_EQ(browser.Eval("return window.idemLive.snapshots;"), 1);

  const std::vector<std::string> severe = browser.Severe();
  EXPECT_TRUE(severe.empty()) << "the browser's console: " << severe.front();
  EXPECT_EQ(WEXITSTATUS(demo.Stop()), 0) << demo.Output();
}

// `idem run --web`: every message published twice; the page counts each
// duplicate as skipped, and its counters are /metrics'.
TEST_F(LiveViewTest, IdemRunServesThePageWithItsOwnCounts) {
  const std::string queue = "embedded:" + dir_.File("q.db");
  Child publish({idem_, "publish", "--source", queue, "--messages", "300", "--dup-rate", "1"}, dir_.File("pub.log"));
  ASSERT_TRUE(WaitFor([&] { return !publish.Running(); }, 60'000));
  Child run({idem_, "run", "--source", queue, "--store", "sqlite:" + dir_.File("s.db"), "--web",
             "127.0.0.1:" + std::to_string(web_port_)},
            dir_.File("run.log"));
  Browser browser(driver_port_);
  ASSERT_TRUE(browser.Start());
  ASSERT_TRUE(WaitFor([&] { return Get("/state").find("\"process\"") != std::string::npos; }, 30'000)) << run.Output();
  browser.Go(Base() + "/");
  ASSERT_TRUE(WaitFor([&] { return PageCounts(browser)["duplicate"] == 300; }, 60'000)) << run.Output();
  const auto metrics = Sums(Get("/metrics"));
  const auto page = PageCounts(browser);
  EXPECT_EQ(page.at("applied"), 300);
  EXPECT_EQ(metrics.at("idem_applied_total"), 300);
  EXPECT_EQ(metrics.at("idem_duplicates_total"), 300);
  EXPECT_EQ(page.at("acked"), metrics.at("idem_acked_total"));
  const std::vector<std::string> severe = browser.Severe();
  EXPECT_TRUE(severe.empty()) << "the browser's console: " << severe.front();
}

// The live view with a thousand messages a second flowing (`idem publish
// --rate 1000` into `idem run --web`, a page open): the page keeps up or says
// what it skipped, and the process applies every message. Prints the
// figures doc/performance.md quotes (no assertion on time: the machine is
// shared); asserts only what must hold on any machine.
TEST_F(LiveViewTest, AThousandMessagesASecondKeepThePageCurrentOrCountedAsSkipped) {
  const int64_t kMessages = std::atoll(Env("IDEM_LIVE_BENCH_MESSAGES", "12000").c_str());
  const std::string queue = "embedded:" + dir_.File("q.db") + "?durable=false";
  Child run({idem_, "run", "--source", queue, "--store", "sqlite:" + dir_.File("s.db") + "?synchronous=normal", "--web",
             "127.0.0.1:" + std::to_string(web_port_)},
            dir_.File("run.log"));
  ASSERT_TRUE(WaitFor([&] { return Get("/state").find("\"process\"") != std::string::npos; }, 30'000)) << run.Output();
  Browser browser(driver_port_);
  ASSERT_TRUE(browser.Start());
  browser.Go(Base() + "/");
  ASSERT_TRUE(WaitFor([&] { return browser.Eval("return !!(window.idemLive && window.idemLive.connected);") == true; },
                      20'000));
  Child publish({idem_, "publish", "--source", queue, "--messages", std::to_string(kMessages), "--rate", "1000"},
                dir_.File("pub.log"));
  // Once a second: how far the page's counters are behind /metrics (in
  // messages applied), and what it skipped.
  std::vector<long long> behind;
  long long max_dropped = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (publish.Running() || PageCounts(browser)["applied"] < kMessages) {
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(120)) break;
    const long long served = Sums(Get("/metrics"))["idem_applied_total"];
    json live = browser.Eval("return window.idemLive;");
    const long long shown = live["counts"].value("applied", 0LL);
    behind.push_back(std::max(0LL, served - shown));
    max_dropped = std::max(max_dropped, live.value("dropped", 0LL));
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto metrics = Sums(Get("/metrics"));
  const auto page = PageCounts(browser);
  EXPECT_EQ(metrics.at("idem_applied_total"), kMessages);
  EXPECT_EQ(page.at("applied"), kMessages) << "the page's counters end equal to /metrics";
  json live = browser.Eval("return window.idemLive;");
  const long long dropped = live.value("dropped", 0LL), animated = live.value("animated", 0LL);
  if (dropped > 0) {  // skipped events are shown as such
    const json text = browser.Eval("return document.getElementById('dropped').textContent;");
    EXPECT_TRUE(text.is_string() && !text.get<std::string>().empty());
  }
  std::sort(behind.begin(), behind.end());
  auto at = [&](double q) { return behind.empty() ? 0LL : behind[static_cast<size_t>(q * (behind.size() - 1))]; };
  std::printf(
      "live-view: messages=%lld rate=1000 seconds=%.1f samples=%zu page_behind_p50=%lld page_behind_max=%lld "
      "events_skipped=%lld animated=%lld batches=%lld\n",
      static_cast<long long>(kMessages), seconds, behind.size(), at(0.5), at(1.0), dropped, animated,
      live.value("batches", 0LL));
  EXPECT_TRUE(browser.Screenshot(shots_ + "/live-flood.png"));
  const std::vector<std::string> severe = browser.Severe();
  EXPECT_TRUE(severe.empty()) << "the browser's console: " << severe.front();
}

// `idem gateway --web` in front of `idem provider`: the page shows the
// gateway's keys (a new key forwarded, its repeats replayed) under the
// gateway's own title, and its counters agree with the gateway's /metrics.
TEST_F(LiveViewTest, IdemGatewayServesThePageWithItsKeys) {
  const int upstream = idem::testing::FirstFreePort(driver_port_ + 1);
  Child provider({idem_, "provider", "--api-key", "sk_1:acct_1", "--listen", "127.0.0.1:" + std::to_string(upstream),
                  "--store", "sqlite:" + dir_.File("p.db"), "--quiet"},
                 dir_.File("provider.log"));
  const int port = idem::testing::FirstFreePort(upstream + 1);
  Child gateway({idem_, "gateway", "--upstream", "http://127.0.0.1:" + std::to_string(upstream), "--listen",
                 "127.0.0.1:" + std::to_string(port), "--store", "sqlite:" + dir_.File("g.db"), "--web",
                 "127.0.0.1:" + std::to_string(web_port_), "--quiet"},
                dir_.File("gateway.log"));
  ASSERT_TRUE(WaitFor([&] { return Get("/state").find("\"process\":\"idem gateway\"") != std::string::npos; }, 30'000))
      << gateway.Output();
  ASSERT_TRUE(WaitFor(
      [&] {
        httplib::Client c("127.0.0.1", upstream);
        auto r = c.Get("/health");
        return r && r->status == 200;
      },
      30'000))
      << provider.Output();
  httplib::Client c("127.0.0.1", port);
  ASSERT_TRUE(WaitFor(  // the view starts before the gateway listens
      [&] {
        auto r = c.Get("/metrics");
        return r && r->status == 200;
      },
      30'000))
      << gateway.Output();
  for (int i = 0; i < 3; ++i) {
    auto r = c.Post("/charges", {{"Authorization", "Bearer sk_1"}, {"Idempotency-Key", "\"live-1\""}},
                    R"({"amount": 100, "currency": "usd", "customer": "cus_1"})", "application/json");
    ASSERT_TRUE(r) << gateway.Output();
    EXPECT_EQ(r->status, 201) << r->body;
  }
  Browser browser(driver_port_);
  ASSERT_TRUE(browser.Start());
  browser.Go(Base() + "/");
  ASSERT_TRUE(WaitFor([&] { return PageCounts(browser)["claim_replayed"] == 2; }, 30'000)) << gateway.Output();
  const auto metrics = Sums(Get("/metrics"));
  EXPECT_EQ(metrics.at("idem_gateway_forwarded_total"), 1);
  EXPECT_EQ(metrics.at("idem_gateway_replayed_total"), 2);
  EXPECT_EQ(PageCounts(browser)["claim_started"], 1);
  EXPECT_EQ(browser.Eval("return [...document.querySelectorAll('#diagram text')]"
                         ".some(t => t.textContent === 'API behind the gateway');"),
            true);
  EXPECT_TRUE(browser.Screenshot(shots_ + "/live-gateway.png"));
  const std::vector<std::string> severe = browser.Severe();
  EXPECT_TRUE(severe.empty()) << "the browser's console: " << severe.front();
}

}  // namespace
}  // namespace idem::testing
