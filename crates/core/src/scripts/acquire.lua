-- Acquire, or re-enter, a reentrant lock.
--
-- KEYS[1]  lock hash       P:{N}        field = owner id, value = hold count
-- KEYS[2]  fence counter   P:{N}:fence  string, no TTL
-- ARGV[1]  owner id
-- ARGV[2]  lease in milliseconds
--
-- Replies:
--   {1, hold_count, fence}  granted. hold_count 1 is a new grant and raised the fence to
--                           max(stored + 1, server TIME in microseconds); a re-entry returns the
--                           current fence unchanged and never shortens the remaining lease.
--   {0, pttl}               held by another owner; pttl is its remaining lease in ms (-1: no TTL).
--   error WRONGTYPE         a key of another type sits where the lock's keys belong.
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'none' then
  local fence_kind = redis.call('TYPE', KEYS[2])['ok']
  if fence_kind ~= 'none' and fence_kind ~= 'string' then
    return redis.error_reply('WRONGTYPE ' .. KEYS[2] .. ' holds a ' .. fence_kind .. ', not a fencing counter')
  end
  -- The fence must keep rising even when Redis lost the counter (restart without persistence,
  -- failover before replication): server time in microseconds is a floor that only moves forward
  -- as long as the server clock does. A double holds integers exactly up to 2^53 (year 2255).
  local now = redis.call('TIME')
  local now_us = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local stored = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
  local fence = math.max(stored + 1, now_us)
  redis.call('SET', KEYS[2], string.format('%.0f', fence))
  redis.call('HSET', KEYS[1], ARGV[1], 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, 1, fence}
end
if kind ~= 'hash' then
  return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' holds a ' .. kind .. ', not a lock')
end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  local count = redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
  if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  return {1, count, tonumber(redis.call('GET', KEYS[2]) or '0') or 0}
end
return {0, redis.call('PTTL', KEYS[1])}
