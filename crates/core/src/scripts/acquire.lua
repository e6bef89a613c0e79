-- Acquire, or re-enter, a reentrant lock.
--
-- KEYS[1]  lock hash       P:{N}        field owner id = hold count, field ~fence = token
-- KEYS[2]  fence counter   P:fence      string, no TTL, shared by every lock of the prefix
-- ARGV[1]  owner id
-- ARGV[2]  lease in milliseconds
--
-- A subscribed waiter (the `lock` and `try_lock_for` family) adds:
-- KEYS[3]  turn queue      P:{N}:queue  zset of client ids with waiters, oldest turn first
-- ARGV[3]  the waiter's client id
-- ARGV[4]  '1' when that client has other waiters on this lock
-- ARGV[5]  release channel  P:{N}:released
--
-- A plain try (try_lock, and a waiter's first try before it subscribed) sends only the first
-- two keys and arguments: every argument costs
-- encoding on the client and a Lua string on the server, on the hottest path there is.
--
-- Replies (the common one is a bare value: no reply table to build on either side):
--   fence                   a new grant (hold count 1), its fencing token as decimal text (or an
--                           integer): the counter was raised to max(stored + 1, server TIME in
--                           microseconds), and the hash keeps the token for re-entries.
--   {hold_count, fence}     a re-entry (hold_count >= 2); the grant's token, unchanged. It never
--                           shortens the remaining lease.
--   {0, pttl}               held by another owner; pttl is its remaining lease in ms (-1: no TTL).
--                           A waiter's client joins the turn queue (keeping its place if queued);
--                           a lock reserved for another client's turn answers with the lease
--                           instead (the wake-up comes by message).
--   error WRONGTYPE         a key of another type sits where the lock's keys belong.
--
-- This is the hot path: every command here costs server CPU on each acquire, so the script
-- uses the fewest that do the job (PTTL doubles as the existence check), and the plain try
-- creates no Lua closures or numbers (an instruction count of the server showed both).
local pttl = redis.call('PTTL', KEYS[1])
local waiter = ARGV[3]

-- A release may have reserved the lock for one client's turn ('~turn:<client id>' is then the
-- hash's only field, for a short grace period): that client's waiter takes it over.
if waiter and pttl ~= -2 and redis.pcall('HEXISTS', KEYS[1], '~turn:' .. waiter) == 1 then
  redis.call('DEL', KEYS[1])
  pttl = -2
end

if pttl == -2 then
  -- The fence must keep rising even when Redis lost the counter (restart without persistence,
  -- failover before replication): server time in microseconds is a floor that only moves
  -- forward as long as the server clock does. One command reads the stored fence and writes
  -- that floor; only when the stored value is ahead (the clock stepped back, or two grants in
  -- one microsecond) is it written again.
  local t = redis.call('TIME')
  local now = t[1] .. string.sub('000000', #t[2] + 1) .. t[2]
  local fence = now
  local stored = redis.pcall('SET', KEYS[2], now, 'GET')
  if type(stored) == 'table' and stored.err then
    return redis.error_reply('WRONGTYPE ' .. KEYS[2] .. ' is not a fencing counter')
  end
  -- Tokens stay decimal text: without leading zeros, a longer number is larger, and at equal
  -- length text order is number order.
  if stored and (#stored > #now or (#stored == #now and stored >= now)) then
    redis.call('SET', KEYS[2], stored)
    fence = redis.call('INCR', KEYS[2])
  end
  if waiter then
    -- A waiter got the lock: its client leaves the queue, or goes to the back when it has
    -- more waiters (scores are microseconds); the other clients hear the turn was taken and
    -- stop their fallback timers. Queue first: a foreign-typed queue key fails the script
    -- here, before any hold exists.
    if ARGV[4] == '1' then
      redis.call('ZADD', KEYS[3], now, waiter)
    else
      redis.call('ZREM', KEYS[3], waiter)
    end
    if redis.call('EXISTS', KEYS[3]) == 1 then
      redis.call('PUBLISH', ARGV[5], '-')
    end
  end
  redis.call('HSET', KEYS[1], ARGV[1], '1', '~fence', fence)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return fence
end
local held = redis.pcall('HEXISTS', KEYS[1], ARGV[1])
if type(held) == 'table' then
  return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' is not a lock')
end
if held == 1 then
  local count = redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
  if pttl < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  return {count, redis.call('HGET', KEYS[1], '~fence') or '0'}
end
if waiter then
  local t = redis.call('TIME')
  redis.call('ZADD', KEYS[3], 'NX', t[1] .. string.sub('000000', #t[2] + 1) .. t[2], waiter)
  -- Entries live while someone could still be waiting; a dead client's entry is popped by the
  -- next release or expires with the queue.
  local lease = tonumber(ARGV[2])
  redis.call('PEXPIRE', KEYS[3], math.max(pttl, lease) + 10000)
  if string.sub(redis.call('HKEYS', KEYS[1])[1] or '', 1, 6) == '~turn:' then
    -- Reserved for another client's turn: the release message (or its fallback) wakes us, so
    -- the timer is only a safety net.
    return {0, lease}
  end
end
return {0, pttl}
