-- Renew many holds and fair-lock queue entries in one round trip (the watchdog's tick).
--
-- KEYS        per item, in order: a hold's lock hash; for a queue entry, the waiters zset and
--             their deadlines zset (and for a semaphore's waiter, what the waiters want: three
--             keys); for a read/write lock's hold or a permit, its hash and its leases zset
--             (two keys). On Cluster, all in one slot: the caller groups by slot.
-- ARGV[1]     lease in milliseconds
-- ARGV[2i]    owner id of item i
-- ARGV[2i+1]  the token of the grant that hold belongs to; '' for a queue entry ('+' for a
--             semaphore's, with the third key); 'r<token>'
--             or 'w<token>' for a read/write lock's read or write hold; 's<token>' for a
--             semaphore's permit (as a read hold, but the semaphore's hash and leases keep no
--             TTL: they live with the semaphore)
--
-- Replies: an array with one integer per item: 1 renewed; 0 that grant is gone (expired,
-- force-unlocked, taken by another owner, replaced by a later grant of the same owner, or the
-- key now holds another type), or that entry is gone (the waiter got the lock or left, or the
-- entry lapsed). A renewal extends only the grant it was made for: the same owner's later
-- grant has another token, and a guard whose grant ended must stay lost.
--
-- A renewal only ever extends: the same owner may have re-entered with a longer explicit lease
-- (lock_with_lease), and that hold's guard counts on its full lease (as acquire.lua does). A
-- queue entry's deadline becomes server time + the lease, and its zsets outlive it by a second
-- (their TTL is only ever lengthened: other clients' entries may have longer leases).
local lease = tonumber(ARGV[1])
local renewed = {}
local k = 1
local now_ms
for i = 1, (#ARGV - 1) / 2 do
  local owner, token = ARGV[2 * i], ARGV[2 * i + 1]
  if token == '' or token == '+' then
    local last = token == '+' and k + 2 or k + 1
    local score = redis.pcall('ZSCORE', KEYS[k + 1], owner)
    if type(score) == 'string' then
      if not now_ms then
        local t = redis.call('TIME')
        now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
      end
      redis.call('ZADD', KEYS[k + 1], now_ms + lease, owner)
      for j = k, last do
        if redis.call('PTTL', KEYS[j]) < lease + 1000 then
          redis.call('PEXPIRE', KEYS[j], lease + 1000)
        end
      end
      renewed[i] = 1
    else
      renewed[i] = 0
    end
    k = last + 1
  elseif string.byte(token, 1) > 57 then
    -- A read/write lock's hold ('r' or 'w' sorts after the digits): its own lease in the
    -- leases zset, which lives as long as the latest lease.
    local side = string.sub(token, 1, 1)
    local read = side ~= 'w'
    local field = read and ('@READ@' .. owner) or owner
    local fields = redis.pcall('HMGET', KEYS[k], field, read and ('@READ_FENCE@' .. owner) or '@FENCE@')
    if not fields.err and fields[1] and fields[2] == string.sub(token, 2)
        and redis.call('TYPE', KEYS[k + 1])['ok'] == 'zset' then
      if not now_ms then
        local t = redis.call('TIME')
        now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
      end
      -- A hold whose lease already ended is over, even if no script has removed it yet.
      local current = redis.call('ZSCORE', KEYS[k + 1], field)
      if current and tonumber(current) > now_ms then
        if tonumber(current) < now_ms + lease then
          redis.call('ZADD', KEYS[k + 1], now_ms + lease, field)
        end
        local latest = redis.call('ZRANGE', KEYS[k + 1], -1, -1, 'WITHSCORES')[2]
        local ttl = math.max(tonumber(latest) - now_ms, 1)
        if side ~= 's' then
          redis.call('PEXPIRE', KEYS[k], ttl)
          redis.call('PEXPIRE', KEYS[k + 1], ttl)
        end
        renewed[i] = 1
      else
        renewed[i] = 0
      end
    else
      renewed[i] = 0
    end
    k = k + 2
  else
    local fields = redis.pcall('HMGET', KEYS[k], owner, '@FENCE@')
    if not fields.err and fields[1] and fields[2] == token then
      if redis.call('PTTL', KEYS[k]) < lease then
        redis.call('PEXPIRE', KEYS[k], ARGV[1])
      end
      renewed[i] = 1
    else
      renewed[i] = 0
    end
    k = k + 1
  end
end
return renewed
