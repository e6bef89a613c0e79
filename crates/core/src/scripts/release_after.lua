-- Let the owner's last hold end by itself later instead of releasing it now (ShedLock's
-- "lock at least for"), or settle such a call whose reply never came.
--
-- KEYS[1]  lock hash  P:{N}
-- KEYS[2]  the lock's waiters  P:{N}:waiters
-- ARGV[1]  owner id
-- ARGV[2]  milliseconds until the lock ends
-- ARGV[3]  the token of the grant the hold must belong to; '' when the client knows the owner's
--          grant is that one
-- ARGV[4]  '' normally; to settle an unanswered call: the hold count the owner has if it did
--          not run. The call is applied only then.
-- ARGV[5]  release channel  P:{N}:released
-- ARGV[6]  waiter channel prefix  P:{N}:released:
-- ARGV[7]  'o' when waiters hear on their owner's channel (the fair lock), '' on their
--          client's (the plain lock)
--
-- Waiters sleep on the lease they last saw, which the tail may cut short. The first waiter in
-- line is woken on its own channel: its try finds the tail, sleeps on it, and takes the lock
-- when it ends (nobody releases a lock that runs out: no grant comes). The release channel
-- hears '@FREE@' (a RedLock's waiters listen there and look again).
--
-- Replies:
--   remaining       remaining > 0: a re-entered hold was released as usual (the owner's outer
--                   holds keep the lock); remaining 0: the last hold was handed to nobody (the
--                   '@EXPIRING@' field), so not even this owner can re-enter, and the lock ends
--                   in ARGV[2] ms.
--   -1              the owner holds nothing here under that token; nothing changed.
--   -2              settling: the count differs; nothing changed.
--   error 'WRONGTYPE 1 ...'  the key holds another type.
-- (The WRONGTYPE check after each pcall is written out where it is needed: a Lua helper
-- function would be a closure created on every call of the script.)

local fields = redis.pcall('HMGET', KEYS[1], ARGV[1], '@FENCE@')
if fields.err then
  if string.sub(fields.err, 1, 9) == 'WRONGTYPE' then
    return redis.error_reply('WRONGTYPE 1 the lock key holds another type')
  end
  return fields
end
local count = fields[1]
if not count or (ARGV[3] ~= '' and fields[2] ~= ARGV[3]) then
  return -1
end
if ARGV[4] ~= '' and count ~= ARGV[4] then
  return -2
end
if count ~= '1' then
  return redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[1], '@EXPIRING@', '1')
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('@PUBLISH@', ARGV[5], '@FREE@')
if redis.call('TYPE', KEYS[2])['ok'] == 'zset' then
  local head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  if head then
    if ARGV[7] ~= 'o' then
      head = string.match(head, '^[^:]*')
    end
    redis.call('@PUBLISH@', ARGV[6] .. head, '@FREE@')
  end
end
return 0
