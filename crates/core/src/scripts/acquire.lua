-- Acquire, or re-enter, a reentrant lock.
--
-- KEYS[1]  lock hash       P:{N}        field = owner id, value = hold count
-- KEYS[2]  fence counter   P:{N}:fence  string, no TTL
-- KEYS[3]  turn queue      P:{N}:queue  zset of client ids with waiters, oldest turn first
-- ARGV[1]  owner id
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  client id when the caller is a subscribed waiter, '' otherwise (try_lock)
-- ARGV[4]  '1' when that client has other waiters on this lock
-- ARGV[5]  release channel  P:{N}:released
-- ARGV[6]  publish command  PUBLISH (SPUBLISH on Cluster)
--
-- Replies:
--   {1, hold_count, fence}  granted. hold_count 1 is a new grant and raised the fence to
--                           max(stored + 1, server TIME in microseconds); a re-entry returns the
--                           current fence unchanged and never shortens the remaining lease.
--   {0, pttl}               held by another owner; pttl is its remaining lease in ms (-1: no TTL).
--                           A waiter's client joins the turn queue (keeping its place if queued);
--                           a lock reserved for another client's turn answers with the lease
--                           instead (the wake-up comes by message).
--   error WRONGTYPE         a key of another type sits where the lock's keys belong.
--
-- This is the hot path: every command here costs server CPU on each acquire, so the script
-- uses the fewest that do the job (PTTL doubles as the existence check).
local pttl = redis.call('PTTL', KEYS[1])
local waiter = ARGV[3]

-- TIME as text: "seconds" .. zero-padded microseconds, with `sep` between them.
local function now(sep)
  local t = redis.call('TIME')
  return t[1] .. sep .. string.sub('000000', #t[2] + 1) .. t[2]
end

-- A waiter got the lock: its client leaves the queue, or goes to the back when it has more
-- waiters; the other clients hear the turn was taken and stop their fallback timers.
local function turn_taken()
  if waiter == '' then
    return
  end
  if ARGV[4] == '1' then
    redis.call('ZADD', KEYS[3], now('.'), waiter)
  else
    redis.call('ZREM', KEYS[3], waiter)
  end
  if redis.call('EXISTS', KEYS[3]) == 1 then
    redis.call(ARGV[6], ARGV[5], '-')
  end
end

-- A release may have reserved the lock for one client's turn ('~turn:<client id>' is then the
-- hash's only field, for a short grace period): that client's waiter takes it over.
if pttl ~= -2 and waiter ~= '' and redis.call('HEXISTS', KEYS[1], '~turn:' .. waiter) == 1 then
  redis.call('DEL', KEYS[1])
  pttl = -2
end

if pttl == -2 then
  -- The fence must keep rising even when Redis lost the counter (restart without persistence,
  -- failover before replication): server time in microseconds is a floor that only moves
  -- forward as long as the server clock does.
  local stored = redis.pcall('GET', KEYS[2])
  if type(stored) == 'table' and stored.err then
    return redis.error_reply('WRONGTYPE ' .. KEYS[2] .. ' is not a fencing counter')
  end
  local now_us = now('')
  local fence
  if stored and tonumber(stored) >= tonumber(now_us) then
    fence = redis.call('INCR', KEYS[2])
  else
    redis.call('SET', KEYS[2], now_us)
    fence = tonumber(now_us)
  end
  -- Queue first: a foreign-typed queue key fails the script here, before any hold exists.
  turn_taken()
  redis.call('HSET', KEYS[1], ARGV[1], 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, 1, fence}
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
  return {1, count, tonumber(redis.call('GET', KEYS[2]) or '0') or 0}
end
if waiter ~= '' then
  redis.call('ZADD', KEYS[3], 'NX', now('.'), waiter)
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
