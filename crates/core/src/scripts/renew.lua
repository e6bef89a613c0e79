-- Renew many holds and waiters' entries in one round trip (the watchdog's tick).
--
-- KEYS        per item, in order: a hold's lock hash; for a read/write lock's hold or a
--             permit, its hash and its leases zset (two keys); for a waiter's entry, its
--             kind's hash, line and deadlines, then a read/write lock's or a semaphore's
--             leases, then a lock's or a semaphore's wants (four or five keys, in the order of
--             the kind's own scripts). On Cluster, all in one slot: the caller groups by slot.
-- ARGV[1]     lease in milliseconds
-- ARGV[2i]    owner id of item i
-- ARGV[2i+1]  the token of the grant that hold belongs to; 'r<token>' or 'w<token>' for a
--             read/write lock's read or write hold; 's<token>' for a semaphore's permit (as a
--             read hold, but the semaphore's hash and leases keep no TTL: they live with the
--             semaphore); for a waiter's entry 'e' and its layout: 'el' a lock's (hash, line,
--             deadlines, wants), 'er' or 'ew' a read/write lock's read or write side (hash, line,
--             deadlines, leases), 'es' a semaphore's (hash, line, deadlines, leases, wants)
--
-- Replies: an array with one integer per item: 1 renewed; 0 that grant is gone (expired,
-- force-unlocked, taken by another owner, replaced by a later grant of the same owner, or the
-- key now holds another type), or that entry is gone (the waiter left, or the entry lapsed)
-- and the line made the waiter no grant it has yet to take. A renewal extends only the grant
-- it was made for: the same owner's later grant has another token, and a guard whose grant
-- ended must stay lost.
--
-- A renewal only ever extends: the same owner may have re-entered with a longer explicit lease
-- (lock_with_lease), and that hold's guard counts on its full lease (as acquire.lua does). A
-- waiter's entry's deadline becomes server time + the lease, and its line's keys outlive it by
-- a second (their TTL is only ever lengthened: other clients' entries may have longer leases).
--
-- A waiter whose entry is gone because the line granted it the lock (a release handed it on)
-- but which has not taken that grant yet (its message came too late, its tries went
-- unanswered) is still alive while its entry is renewed: the renewal keeps that grant (marked
-- '@GRANTED@' in the hash) for one more lease, as it would have kept the entry. So a live
-- waiter never loses a grant it cannot take yet, and one that died holds it at most one lease
-- after its last renewal.
local lease = tonumber(ARGV[1])
local renewed = {}
local k = 1
local now_ms

-- Reads the server's clock once per call, when first needed.
local function now()
  if not now_ms then
    local t = redis.call('TIME')
    now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
end

-- Lengthens the lease of `member` in a leases zset to server time + the lease, if it is still
-- running; with `ttl_keys`, those keys then live as long as the latest lease there (a
-- read/write lock's hash and leases). Returns whether it was running.
local function extend_lease(leases, member, ttl_keys)
  now()
  local current = redis.call('ZSCORE', leases, member)
  if not current or tonumber(current) <= now_ms then
    return false
  end
  if tonumber(current) < now_ms + lease then
    redis.call('ZADD', leases, now_ms + lease, member)
  end
  if ttl_keys then
    local latest = redis.call('ZRANGE', leases, -1, -1, 'WITHSCORES')[2]
    local ttl = math.max(tonumber(latest) - now_ms, 1)
    for _, key in ipairs(ttl_keys) do
      redis.call('PEXPIRE', key, ttl)
    end
  end
  return true
end

-- Keeps the grant the line made to the waiting `owner` (its entry gone: the grant took it
-- out), if it has not taken it yet: marked in the hash as the line's. Returns whether there
-- was one.
local function keep_grant(layout, hash, leases, owner)
  if redis.call('TYPE', hash)['ok'] ~= 'hash' then
    return false
  end
  if layout == 'l' then
    local fields = redis.call('HMGET', hash, owner, '@GRANTED@')
    if not (fields[1] and fields[2]) then
      return false
    end
    if redis.call('PTTL', hash) < lease then
      redis.call('PEXPIRE', hash, lease)
    end
    return true
  end
  if redis.call('TYPE', leases)['ok'] ~= 'zset' then
    return false
  end
  if layout == 's' then
    return redis.call('HEXISTS', hash, '@GRANTED@:' .. owner) == 1
      and extend_lease(leases, '@READ@' .. owner, nil)
  end
  -- A read/write lock's: the grant on the side the entry waits for ('r' or 'w'; an owner's two
  -- sides share one entry, and the other side's hold is not this wait's).
  local member, mark
  if layout == 'r' then
    member = '@READ@' .. owner
    mark = '@GRANTED@:' .. member
  elseif redis.call('HGET', hash, '@WRITER@') == owner then
    member, mark = owner, '@GRANTED@'
  else
    return false
  end
  return redis.call('HEXISTS', hash, mark) == 1 and extend_lease(leases, member, {hash, leases})
end
for i = 1, (#ARGV - 1) / 2 do
  local owner, token = ARGV[2 * i], ARGV[2 * i + 1]
  if string.byte(token, 1) == 101 then
    -- A waiter's entry ('e'): its hash, line and deadlines, then the layout's own keys.
    local layout = string.sub(token, 2, 2)
    local hash, deadlines = KEYS[k], KEYS[k + 2]
    local leases = layout ~= 'l' and KEYS[k + 3]
    local wants = (layout == 'l' and KEYS[k + 3]) or (layout == 's' and KEYS[k + 4])
    local score = redis.pcall('ZSCORE', deadlines, owner)
    if type(score) == 'string' then
      now()
      redis.call('ZADD', deadlines, now_ms + lease, owner)
      for _, key in ipairs({KEYS[k + 1], deadlines, wants or nil}) do
        if redis.call('PTTL', key) < lease + 1000 then
          redis.call('PEXPIRE', key, lease + 1000)
        end
      end
      renewed[i] = 1
    else
      renewed[i] = keep_grant(layout, hash, leases, owner) and 1 or 0
    end
    k = k + (layout == 's' and 5 or 4)
  elseif string.byte(token, 1) > 57 then
    -- A read/write lock's hold or a permit ('r', 'w' or 's' sorts after the digits): its own
    -- lease in the leases zset; a read/write lock's keys live as long as the latest lease.
    local side = string.sub(token, 1, 1)
    local read = side ~= 'w'
    local field = read and ('@READ@' .. owner) or owner
    local fields = redis.pcall('HMGET', KEYS[k], field, read and ('@READ_FENCE@' .. owner) or '@FENCE@')
    -- A hold whose lease already ended is over, even if no script has removed it yet.
    local held = not fields.err and fields[1] and fields[2] == string.sub(token, 2)
      and redis.call('TYPE', KEYS[k + 1])['ok'] == 'zset'
      and extend_lease(KEYS[k + 1], field, side ~= 's' and {KEYS[k], KEYS[k + 1]} or nil)
    renewed[i] = held and 1 or 0
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
