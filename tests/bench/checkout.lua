-- wrk script for POST /v1/checkouts. Arguments (after --):
--   mode   "new": a new Idempotency-Key per request; "replay": the same key
--          and body every time
--   prefix the key prefix (new) or the key (replay)
--   skus   how many bench skus to spread over ("0": sku_tee only)
--   rate   requests per second this thread sends at most, on a schedule
--          (0: as fast as the answers come back)
-- Answers are not checked here: wrk counts non-2xx statuses, and done()
-- prints one JSON line that tests/bench reads.
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("tid", threads)
end

local ffi = require("ffi")
ffi.cdef[[
typedef struct { long tv_sec; long tv_usec; } bench_timeval;
int gettimeofday(bench_timeval *tv, void *tz);
]]
local tv = ffi.new("bench_timeval")
local function now_ms()
  ffi.C.gettimeofday(tv, nil)
  return tonumber(tv.tv_sec) * 1000 + tonumber(tv.tv_usec) / 1000
end

local mode, prefix, skus, rate = "new", "k", 0, 0
local start, scheduled = nil, 0
local n = 0
local fixed = nil
local headers = {
  ["Authorization"] = "Bearer sk_test_acme",
  ["Content-Type"] = "application/json",
}

local function body(sku)
  return '{"email":"buyer@example.com","items":[{"sku":"' .. sku ..
    '","quantity":1}],"payment_method":"pm_card_visa"}'
end

function init(args)
  mode, prefix = args[1] or "new", args[2] or "k"
  skus, rate = tonumber(args[3] or "0"), tonumber(args[4] or "0")
  math.randomseed(tid * 7919 + os.time())
  if mode == "replay" then
    headers["Idempotency-Key"] = prefix
    fixed = wrk.format("POST", "/v1/checkouts", headers, body("sku_tee"))
  end
end

function request()
  if fixed then
    return fixed
  end
  n = n + 1
  headers["Idempotency-Key"] = prefix .. "-" .. tid .. "-" .. n
  local sku = "sku_tee"
  if skus > 0 then
    sku = string.format("sku_b%04d", math.random(0, skus - 1))
  end
  return wrk.format("POST", "/v1/checkouts", headers, body(sku))
end

-- delay keeps this thread's requests on a fixed schedule (rate a second)
-- whatever the answers' latency, as long as a connection is free.
function delay()
  if rate <= 0 then
    return 0
  end
  if start == nil then
    start = now_ms()
  end
  local due = start + scheduled * 1000 / rate
  scheduled = scheduled + 1
  local wait = due - now_ms()
  if wait < 0 then
    return 0
  end
  return wait
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_us":%d,"status_errors":%d,"socket_errors":%d,"p50_us":%d,"p99_us":%d}\n',
    summary.requests, summary.duration, e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
