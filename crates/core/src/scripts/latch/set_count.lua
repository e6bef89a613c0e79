-- Set a count-down latch's count if it is not counting down (Redisson's trySetCount): a new
-- round starts.
--
-- KEYS[1]  latch hash     P:{N}  '@KIND@' -> 'latch', '@LATCH@' -> the count, '@ROUND@' -> the
--                                round's id; no TTL: it lives until the count reaches zero
-- KEYS[2]  fence counter  P:{T}:fence (as the locks'): a round's id is the slot's next fencing
--                                token, so ids never repeat and a later round's is larger
-- ARGV[1]  the count (1 to 2^32 - 1)
--
-- A waiter remembers the round it began in: that round is open once the latch is gone or holds
-- another round, so a waiter of round k goes even when round k + 1 starts the moment k opens.
--
-- Replies: 1 set; 0 the latch is already counting down. 'WRONGTYPE 1 ...' when the key is not a
-- hash; 'WRONGKIND <kind> latch' when the name is in use by another kind. Nothing is written
-- then.
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'none' then
  if kind ~= 'hash' then
    return redis.error_reply('WRONGTYPE 1 the latch key holds another type')
  end
  local held_as = redis.call('HGET', KEYS[1], '@KIND@') or 'lock'
  if held_as ~= 'latch' then
    return redis.error_reply('WRONGKIND ' .. held_as .. ' latch')
  end
  return 0
end
local t = redis.call('TIME')
@NEXT_FENCE@
redis.call('HSET', KEYS[1], '@KIND@', 'latch', '@LATCH@', ARGV[1], '@ROUND@', fence)
return 1
