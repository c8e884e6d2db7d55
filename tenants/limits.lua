-- One tenant's shared rate limits, decided atomically in one round trip.
-- KEYS[1]: the tenant's hash. Fields: rt (request bucket), tt (token bucket), ts (last refill,
-- unix ms), out (tokens reserved by admitted requests not done), inf (requests in flight).
-- ARGV: op ("admit" | "done"), now_ms, rpm, tpm, max_concurrent, reserved, used.
-- A limit of 0 is unlimited. Returns for admit: {code, retry_ms, remaining_requests,
-- remaining_tokens}; code 0 admitted, 1 requests, 2 tokens, 3 concurrency.
local key = KEYS[1]
local op = ARGV[1]
local now = tonumber(ARGV[2])
local rpm = tonumber(ARGV[3])
local tpm = tonumber(ARGV[4])
local maxc = tonumber(ARGV[5])
local reserved = tonumber(ARGV[6])
local used = tonumber(ARGV[7])

local s = redis.call('HMGET', key, 'rt', 'tt', 'ts', 'out', 'inf')
local rt = tonumber(s[1]) or rpm
local tt = tonumber(s[2]) or tpm
local ts = tonumber(s[3]) or now
local out = tonumber(s[4]) or 0
local inf = tonumber(s[5]) or 0

local elapsed = math.max(0, now - ts)
rt = math.min(rpm, rt + elapsed * rpm / 60000)
tt = math.min(tpm, tt + elapsed * tpm / 60000)
ts = math.max(ts, now)

local function save()
  redis.call('HSET', key, 'rt', tostring(rt), 'tt', tostring(tt), 'ts', tostring(ts), 'out', tostring(out), 'inf', tostring(inf))
  -- A replica that dies holding reservations leaks them only until the tenant is idle this long.
  redis.call('PEXPIRE', key, 120000)
end

local function remaining()
  return math.max(0, math.floor(rt)), math.max(0, math.floor(tt - out))
end

if op == 'done' then
  out = math.max(0, out - reserved)
  inf = math.max(0, inf - 1)
  if tpm > 0 then
    tt = math.max(-tpm, tt - math.min(used, tpm))
  end
  save()
  return {0, 0, remaining()}
end

local code, retry = 0, 0
if maxc > 0 and inf >= maxc then
  code, retry = 3, 1000
elseif rpm > 0 and rt < 1 then
  code, retry = 1, math.ceil((1 - rt) * 60000 / rpm)
elseif tpm > 0 and reserved > tpm then
  code, retry = 2, 60000
elseif tpm > 0 and reserved > tt - out then
  code, retry = 2, math.ceil((reserved - (tt - out)) * 60000 / tpm)
end
if code == 0 then
  if rpm > 0 then rt = rt - 1 end
  out = out + reserved
  inf = inf + 1
end
save()
local rr, rtok = remaining()
return {code, retry, rr, rtok}
