-- Count a latch down by one; at zero the latch is gone and its waiters are told.
--
-- KEYS[1]  latch hash  P:{N}  '@LATCH@' -> the count (no TTL: it lives until it reaches zero)
-- ARGV[1]  release channel  P:{N}:released
--
-- Replies: the count left (0: it just opened, or was open already). A key of another kind
-- (a lock's hash) is refused with 'WRONGTYPE 1 ...'.
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'none' then
  return 0
end
if kind ~= 'hash' or redis.call('HEXISTS', KEYS[1], '@LATCH@') == 0 then
  return redis.error_reply('WRONGTYPE 1 the key is not a count-down latch')
end
local left = redis.call('HINCRBY', KEYS[1], '@LATCH@', -1)
if left <= 0 then
  redis.call('DEL', KEYS[1])
  redis.call('@PUBLISH@', ARGV[1], '@FREE@')
  return 0
end
return left
