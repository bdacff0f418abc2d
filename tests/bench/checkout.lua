-- wrk script for POST /v1/checkouts. Arguments (after --):
--   mode   "new": a new Idempotency-Key per request; "replay": the same key
--          and body every time
--   prefix the key prefix (new) or the key (replay)
--   skus   how many bench skus to spread over ("0": sku_tee only)
--   delay  milliseconds each connection waits between requests (0: none)
-- Answers are not checked here: wrk counts non-2xx statuses, and done()
-- prints one JSON line that tests/bench reads.
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("tid", threads)
end

local mode, prefix, skus, pause = "new", "k", 0, 0
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
  skus, pause = tonumber(args[3] or "0"), tonumber(args[4] or "0")
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

function delay()
  return pause
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_us":%d,"status_errors":%d,"socket_errors":%d,"p50_us":%d,"p99_us":%d}\n',
    summary.requests, summary.duration, e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
