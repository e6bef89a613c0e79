-- Set a count-down latch's count if it is not set (Redisson's trySetCount).
--
-- KEYS[1]  latch hash  P:{N}
-- ARGV[1]  the count (> 0)
--
-- Replies: 1 set; 0 the latch is already counting down. 'WRONGTYPE 1 ...' when the key is
-- something else.
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'none' then
  if kind == 'hash' and redis.call('HEXISTS', KEYS[1], '@LATCH@') == 1 then
    return 0
  end
  return redis.error_reply('WRONGTYPE 1 the key is not a count-down latch')
end
redis.call('HSET', KEYS[1], '@LATCH@', ARGV[1])
return 1
