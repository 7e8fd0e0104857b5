-- wrk script for the saturation runs: cycles through the prepared AdmissionReview
-- requests (bodies file: one "PATH<TAB>JSON" per line, passed after "--"), each
-- serialised once in init, and prints a JSON summary line prefixed WRK_RESULT.
local reqs = {}
local i = 0

function init(args)
  for line in io.lines(args[1]) do
    local tab = string.find(line, "\t", 1, true)
    if tab then
      local path = string.sub(line, 1, tab - 1)
      local body = string.sub(line, tab + 1)
      reqs[#reqs + 1] = wrk.format("POST", path, {["Content-Type"] = "application/json"}, body)
    end
  end
  i = math.random(#reqs)
end

function request()
  i = i % #reqs + 1
  return reqs[i]
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK_RESULT {"requests":%d,"duration_us":%d,"bytes":%d,' ..
    '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
    '"latency_us":{"p50":%d,"p90":%d,"p99":%d,"max":%d,"mean":%.1f}}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max, latency.mean))
end
