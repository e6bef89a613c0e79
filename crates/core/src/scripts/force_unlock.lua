-- Release a lock whoever holds it, and wake its waiters (operator's escape hatch).
--
-- KEYS[1]  lock hash  P:{N}
-- ARGV[1]  release channel  P:{N}:released
--
-- Replies: 1 a lock was removed (and '@FREE@' published: one waiter per client wakes); 0 there
-- was none.
-- error 'WRONGTYPE 1 ...' the key holds another type (it is not ours to delete).
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'none' then
  return 0
end
if kind ~= 'hash' then
  return redis.error_reply('WRONGTYPE 1 the key holds a ' .. kind .. ', not a lock')
end
redis.call('PUBLISH', ARGV[1], '@FREE@')
redis.call('DEL', KEYS[1])
return 1
