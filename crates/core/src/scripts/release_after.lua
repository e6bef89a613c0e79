-- Let the owner's last hold end by itself later instead of releasing it now (ShedLock's
-- "lock at least for").
--
-- KEYS[1]  lock hash  P:{N}
-- ARGV[1]  owner id
-- ARGV[2]  milliseconds until the lock ends
--
-- Replies:
--   remaining       remaining > 0: a re-entered hold was released as usual (the owner's outer
--                   holds keep the lock); remaining 0: the last hold was handed to nobody (the
--                   '~expiring' field), so not even this owner can re-enter, and the lock ends
--                   in ARGV[2] ms.
--   -1              the owner holds nothing here; nothing changed.
--   error WRONGTYPE the key holds another type.
local count = redis.pcall('HGET', KEYS[1], ARGV[1])
if type(count) == 'table' then
  return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' is not a lock')
end
if not count then
  return -1
end
if count ~= '1' then
  return redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[1], '~expiring', '1')
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 0
