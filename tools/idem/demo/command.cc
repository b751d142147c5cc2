// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem demo: the command (its flags, their checks, the live view); the parts
// are in this directory, listed in demo.h.
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <system_error>
#include <type_traits>

#include "commands.h"
#include "demo/demo.h"
#include "idem/metrics.h"
#include "live/feed.h"
#include "live/web.h"

namespace idem::cli {
namespace {

using demo::Config;
using demo::g_live;

// Reads the flags into `cfg` and checks them.
Status ParseConfig(const Args& args, Config& cfg) {
  auto num = [&](const char* name, auto& out) -> Status {
    auto v = args.GetInt(name);
    if (!v.ok()) return v.status();
    out = static_cast<std::remove_reference_t<decltype(out)>>(*v);
    return Status::OK();
  };
  // A finite number from 0 to 1, nothing else: "nan" (which fails every
  // comparison), "inf", "0.5x" and "" are refused.
  auto rate = [&](const char* name, double& out) -> Status {
    IDEM_ASSIGN_OR_RETURN(out, args.GetDouble(name, 0, 1));
    return Status::OK();
  };
  int64_t consumers = cfg.consumers;
  for (const Status& s :
       {num("messages", cfg.messages), num("consumers", consumers), num("lease-ms", cfg.lease_ms),
        num("seed", cfg.seed), rate("dup-rate", cfg.dup_rate), rate("lost-ack-rate", cfg.lost_ack_rate),
        rate("stall-rate", cfg.stall_rate), rate("lost-response-rate", cfg.lost_response_rate)})
    IDEM_RETURN_IF_ERROR(s);
  if (cfg.messages < 1) return Status::InvalidArgument("--messages must be at least 1");
  // (Checked before it narrows to an int: 4294967297 is not 1.)
  if (consumers < 1 || consumers > 64) return Status::InvalidArgument("--consumers must be from 1 to 64");
  cfg.consumers = static_cast<int>(consumers);
  if (cfg.lease_ms < 50) return Status::InvalidArgument("--lease-ms must be at least 50");
  cfg.json = args.Bool("json");
  demo::g_store_url = args.Get("store");
  cfg.story = !args.Bool("skip-story");
  return Status::OK();
}

// --dir (made if absent), or a fresh temporary directory.
Status MakeWorkDir(const Args& args, Config& cfg) {
  if (args.Has("dir")) {
    cfg.dir = args.Get("dir");
    struct stat st {};
    if (::stat(cfg.dir.c_str(), &st) != 0) {
      std::error_code ec;
      std::filesystem::create_directories(cfg.dir, ec);
      if (ec) return Status::Unavailable("cannot create --dir " + cfg.dir + ": " + ec.message());
    } else if (!S_ISDIR(st.st_mode)) {
      return Status::InvalidArgument("--dir " + cfg.dir + " is not a directory");
    }
    return Status::OK();
  }
  std::error_code ec;
  std::filesystem::path tmp = std::filesystem::temp_directory_path(ec);
  if (ec) tmp = "/tmp";
  std::string tmpl = (tmp / "idem-demo-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) return Status::Unavailable("cannot create a temporary directory");
  cfg.dir = tmpl;
  return Status::OK();
}

// --web: the live view, fed by this process and (over a socket in DIR) by
// the consumer processes; /metrics counts the same events.
struct LiveView {
  std::unique_ptr<live::Feed> feed;
  std::unique_ptr<live::WebServer> web;
  Metrics registry;
};

Status StartLiveView(const Args& args, const Config& cfg, LiveView& view) {
  IDEM_ASSIGN_OR_RETURN(int64_t pace, ParseDurationMs(args.Get("pace")));
  if (pace < 0) return Status::InvalidArgument("--pace must not be negative");
  view.feed = std::make_unique<live::Feed>("idem demo");
  view.feed->Forward(&view.registry);
  Metrics* registry = &view.registry;
  IDEM_ASSIGN_OR_RETURN(view.web, live::WebServer::Start("web", args.Get("web"), view.feed.get(),
                                                         [registry] { return registry->Render(); }));
  g_live.socket = cfg.dir + "/live.sock";
  IDEM_RETURN_IF_ERROR(view.feed->Listen(g_live.socket));
  g_live.feed = view.feed.get();
  g_live.pace_ms = pace;
  std::cerr << "live view: " << view.web->url() << " (the story at one line per " << pace
            << " ms, then the larger run)\n";
  return Status::OK();
}

// After the run, the live view stays up until SIGINT or SIGTERM.
void StayUpUntilSignalled(const LiveView& view, bool ok, const demo::Out& say) {
  say(ok ? "The demo is done: every total as expected." : "The demo is done: a total differs (see above).");
  std::cerr << "live view: " << view.web->url() << " stays up until SIGINT/SIGTERM\n";
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  int sig = 0;
  sigwait(&stop, &sig);
  g_live.feed = nullptr;
}

}  // namespace

const Command& DemoCommand() {
  static const Command c{
      "demo",
      "Tell the idempotent consumer's story by doing it on SQLite and the embedded queue:\n"
      "no guard (charged twice), the guard (marker + charge in one transaction), redelivery and a race,\n"
      "a call over HTTP to a payment provider on loopback with an idempotency key (its response lost, the\n"
      "retry answered from the provider's store), crashes between separate writes, then a larger run with\n"
      "competing consumer processes, lost acks, lease expiries, producer duplicates and lost provider\n"
      "responses. Exits 1 if the totals differ from the expected ones.",
      "[--dir DIR] [--store URL] [--source URL] [--messages N] [--consumers C] [--web HOST:PORT [--pace DURATION]]\n"
      "       [--json]",
      {{"dir", "DIR", "", "work directory (default: a fresh temporary directory)"},
       {"source", "URL", "",
        "run on a broker instead: redis://...?stream=S, amqp://...?queue=Q, kafka://...?topic=T,\n"
        "          sqs://QUEUE?endpoint=URL, pubsub://PROJECT/SUBSCRIPTION?topic=T,\n"
        "          or kafka-mock: (librdkafka's mock cluster in this process); see idem run --help"},
       {"store", "URL", "",
        "the store: postgres://... or dynamodb://TABLE?endpoint=URL (default: a SQLite file per step in DIR)"},
       {"messages", "N", "10000", "unique payment messages in the larger run"},
       {"consumers", "C", "4", "competing consumer processes"},
       {"lease-ms", "MS", "500", "the queue's lease (visibility timeout)"},
       {"dup-rate", "P", "0.05", "fraction of messages the producer publishes twice"},
       {"lost-ack-rate", "P", "0.03", "fraction of acks lost"},
       {"stall-rate", "P", "0.002", "fraction of receives that stall past the lease"},
       {"lost-response-rate", "P", "0.02", "fraction of charges whose HTTP response the provider drops"},
       {"seed", "S", "1", "random seed of the larger run"},
       {"skip-story", "", "", "only the larger run"},
       {"web", "HOST:PORT", "",
        "serve the live view: the story at --pace, then the larger run live; it stays up\n"
        "          after the run until SIGINT/SIGTERM"},
       {"pace", "DURATION", "1500ms", "with --web: how long each line of the story stays before the next"},
       {"json", "", "", "print one JSON object instead of the story"}}};
  return c;
}

int RunDemo(const Args& args) {
  Config cfg;
  if (Status s = ParseConfig(args, cfg); !s.ok()) return Fail("demo", s);
  if (Status s = MakeWorkDir(args, cfg); !s.ok()) return Fail("demo", s);
  demo::Out say{cfg.json};
  LiveView view;
  if (args.Has("web")) {
    if (Status s = StartLiveView(args, cfg, view); !s.ok()) return Fail("demo", s);
  }
  if (args.Has("source") && args.Get("source").rfind("embedded:", 0) != 0)
    return demo::RunDemoOnSource(cfg, args.Get("source"), say);
  Json story;
  bool story_ok = true;
  if (cfg.story) {
    auto told = demo::RunStory(cfg, say, story);
    if (!told.ok()) return Fail("demo", told.status());
    story_ok = *told;
  }
  say("The larger run: " + std::to_string(cfg.messages) + " payment messages, " + std::to_string(cfg.consumers) +
      " competing consumer processes, injected faults (seed " + std::to_string(cfg.seed) + ")");
  auto run = demo::LargerRun(cfg, say);
  if (!run.ok()) return Fail("demo", run.status());
  bool ok = run->ok && story_ok;
  if (cfg.json) {
    Json j = run->json;
    if (cfg.story) j.AddRaw("story", story.str()).Add("story_ok", story_ok);
    j.Add("ok", ok);
    std::cout << j.str() << "\n";
  }
  if (view.web) StayUpUntilSignalled(view, ok, say);
  return ok ? kExitOk : kExitCheckFailed;
}

}  // namespace idem::cli
