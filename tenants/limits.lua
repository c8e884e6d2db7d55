-- One tenant's shared limits at one tier, decided atomically in one round trip.
-- KEYS[1]: the bucket hash: rt (request bucket), tt (token bucket), ts (last refill, unix ms),
--   out (tokens reserved by live leases), and r:<lease> (the tokens each live lease reserved).
-- KEYS[2]: the leases, a sorted set of lease ids scored by their expiry (unix ms). A lease is one
--   admitted request in flight; its replica renews it every lease_ttl/3 until the request is done.
--   A lease whose release was lost (Redis cut, replica killed) expires on its own and is pruned by
--   the next admission, so its concurrency slot and its reservation come back within lease_ttl.
-- ARGV: op ("admit" | "done" | "cancel" | "renew"), now_ms, rpm, tpm, max_concurrent,
--   lease_ttl_ms, then
--   admit: lease id ("" to hold none), reserved tokens;
--   done: lease id ("" for none), used tokens;
--   cancel: lease id ("" for none), 0: as done, and the request admitted is given back too (the
--     tenant's other counters refused it);
--   renew: the ids of the leases to extend (those already expired stay expired).
-- A limit of 0 is unlimited. A refusal writes nothing but the pruning of expired leases, so
-- retries never extend any expiry. Returns {code, retry_ms, remaining_requests,
-- remaining_tokens}; code 0 admitted (or done, renewed), 1 requests, 2 tokens, 3 concurrency.
local bucket, leases = KEYS[1], KEYS[2]
local op = ARGV[1]
local now = tonumber(ARGV[2])
local rpm = tonumber(ARGV[3])
local tpm = tonumber(ARGV[4])
local maxc = tonumber(ARGV[5])
local ttl = tonumber(ARGV[6])
-- Both keys outlive the last lease by a full refill, after which the bucket would be full anyway.
local keep = ttl + 60000

if op == 'renew' then
  for i = 7, #ARGV do
    redis.call('ZADD', leases, 'XX', now + ttl, ARGV[i])
  end
  redis.call('PEXPIRE', leases, keep)
  redis.call('PEXPIRE', bucket, keep)
  return {0, 0, 0, 0}
end

local s = redis.call('HMGET', bucket, 'rt', 'tt', 'ts', 'out')
local rt = tonumber(s[1]) or rpm
local tt = tonumber(s[2]) or tpm
local ts = tonumber(s[3]) or now
local out = tonumber(s[4]) or 0

local elapsed = math.max(0, now - ts)
rt = math.min(rpm, rt + elapsed * rpm / 60000)
tt = math.min(tpm, tt + elapsed * tpm / 60000)
ts = math.max(ts, now)

-- %.17g keeps every digit: tostring's 14 would round large token counts.
local function num(x) return string.format('%.17g', x) end

local function save()
  redis.call('HSET', bucket, 'rt', num(rt), 'tt', num(tt), 'ts', num(ts), 'out', num(out))
  redis.call('PEXPIRE', bucket, keep)
end

local function remaining()
  return math.max(0, math.floor(rt)), math.max(0, math.floor(tt - out))
end

if op == 'done' or op == 'cancel' then
  local lease, used = ARGV[7], tonumber(ARGV[8])
  if op == 'cancel' and rpm > 0 then
    rt = math.min(rpm, rt + 1)
  end
  -- A lease already expired was pruned with its reservation: nothing to give back twice.
  if lease ~= '' and redis.call('ZREM', leases, lease) == 1 then
    out = math.max(0, out - (tonumber(redis.call('HGET', bucket, 'r:' .. lease)) or 0))
    redis.call('HDEL', bucket, 'r:' .. lease)
  end
  if tpm > 0 then
    tt = math.max(-tpm, tt - math.min(used, tpm))
  end
  save()
  return {0, 0, remaining()}
end

-- Prune expired leases, a bounded number per call; any left still count until the next call.
local pruned = false
local gone = redis.call('ZRANGEBYSCORE', leases, '-inf', now, 'LIMIT', 0, 100)
if #gone > 0 then
  local fields = {}
  for i, id in ipairs(gone) do fields[i] = 'r:' .. id end
  local held = redis.call('HMGET', bucket, unpack(fields))
  for i = 1, #held do out = out - (tonumber(held[i]) or 0) end
  out = math.max(0, out)
  redis.call('ZREM', leases, unpack(gone))
  redis.call('HDEL', bucket, unpack(fields))
  pruned = true
end

local reserved = tonumber(ARGV[8])
local code, retry = 0, 0
if maxc > 0 and redis.call('ZCARD', leases) >= maxc then
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
  local lease = ARGV[7]
  if lease ~= '' then
    redis.call('ZADD', leases, now + ttl, lease)
    redis.call('PEXPIRE', leases, keep)
    if reserved > 0 then
      out = out + reserved
      redis.call('HSET', bucket, 'r:' .. lease, num(reserved))
    end
  end
  save()
elseif pruned and redis.call('EXISTS', bucket) == 1 then
  redis.call('HSET', bucket, 'out', num(out))
end
local rr, rtok = remaining()
return {code, retry, rr, rtok}
