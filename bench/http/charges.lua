-- wrk driver for idem provider's POST /charges (adapted from the peers'
-- ../shared/peers/http-idempotency-key/charges.lua: same request sequence,
-- clock and result line; idem's API: a quoted sf-string key, a bearer API
-- key, {"amount","currency","customer"}, and a charge with "id" and
-- "idempotency_key" in the answer).
-- Run with ONE wrk thread (-t1) so the request sequence is global and exact:
--   request i (0-based, i < TOTAL) uses key (i % K): pass 1 sends keys 0..K-1,
--   pass 2 sends them again, so a key's two requests are never in flight together.
-- After TOTAL /charges requests have been issued, further requests (only the few
-- connections still busy) go to GET /health and are not counted.
-- The clock runs from the first /charges request to the TOTAL-th /charges
-- response (CLOCK_MONOTONIC via LuaJIT ffi); then the script SIGINTs wrk so it
-- stops early instead of sleeping out -d.
local ffi = require("ffi")
ffi.cdef [[
typedef struct { long tv_sec; long tv_nsec; } peers_timespec;
int clock_gettime(int clk_id, peers_timespec *tp);
int getpid(void);
int kill(int pid, int sig);
]]
local ts = ffi.new("peers_timespec")
local function now()
  ffi.C.clock_gettime(1, ts) -- CLOCK_MONOTONIC
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

local K = tonumber(os.getenv("K") or "20000")
local TOTAL = tonumber(os.getenv("TOTAL") or tostring(2 * K))

-- globals (read from done() through thread:get)
issued, responses, bad, replays, mismatches, t0, t1 = 0, 0, 0, 0, 0, 0, 0
local first = {}
local health = nil
local verified = false
local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

function request()
  -- wrk calls request() once on this thread's state before the run, only to
  -- verify/count the requests (script_verify_request); that one is never sent.
  if not verified then
    verified = true
    return wrk.format("GET", "/health")
  end
  if issued >= TOTAL then
    if health == nil then health = wrk.format("GET", "/health") end
    return health
  end
  local k = issued % K
  issued = issued + 1
  if issued == 1 then t0 = now() end
  return wrk.format("POST", "/charges",
    { ["Content-Type"] = "application/json",
      ["Authorization"] = "Bearer " .. (os.getenv("API_KEY") or "sk_bench"),
      ["Idempotency-Key"] = string.format('"00000000-0000-4000-8000-%012x"', k) },
    string.format('{"amount":%d,"currency":"usd","customer":"cus_bench"}', (k % 1000) + 1))
end

function response(status, headers, body)
  if body == "healthy" or responses >= TOTAL then return end
  responses = responses + 1
  local cid, key = nil, nil
  if status >= 200 and status <= 299 then
    cid, key = string.match(body, '"id":"([^"]*)","idempotency_key":"([^"]*)"')
  end
  if cid == nil then
    bad = bad + 1
  elseif first[key] == nil then
    first[key] = cid
  else
    replays = replays + 1
    if first[key] ~= cid then mismatches = mismatches + 1 end
  end
  if responses == TOTAL then
    t1 = now()
    ffi.C.kill(ffi.C.getpid(), 2) -- SIGINT: wrk's main thread stops the run now
  end
end

function done(summary, latency, requests)
  for _, t in ipairs(threads) do
    io.write(string.format(
      "lua: issued=%d responses=%d bad=%d replays=%d mismatches=%d elapsed_s=%.6f p50_ms=%.3f p99_ms=%.3f socket_errors=%d\n",
      t:get("issued"), t:get("responses"), t:get("bad"), t:get("replays"), t:get("mismatches"),
      t:get("t1") - t:get("t0"), latency:percentile(50) / 1000, latency:percentile(99) / 1000,
      summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout))
  end
end
