-- Release one hold of a reentrant lock.
--
-- KEYS[1]  lock hash  P:{N}
-- ARGV[1]  owner id
-- ARGV[2]  release channel  P:{N}:released
-- ARGV[3]  publish command  PUBLISH (SPUBLISH on Cluster)
--
-- Replies:
--   {1, remaining}  one hold released; remaining 0 means the lock is free and the release was
--                   published, so one waiter per subscribed client wakes up.
--   {0}             the owner holds nothing here (wrong owner, expired, double unlock); nothing
--                   changed.
--   error WRONGTYPE the key holds another type.
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'hash' then
  if kind == 'none' then return {0} end
  return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' holds a ' .. kind .. ', not a lock')
end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  return {0}
end
local remaining = redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
if remaining > 0 then
  return {1, remaining}
end
redis.call('HDEL', KEYS[1], ARGV[1])
if redis.call('HLEN', KEYS[1]) == 0 then
  redis.call('DEL', KEYS[1])
end
redis.call(ARGV[3], ARGV[2], 'released')
return {1, 0}
