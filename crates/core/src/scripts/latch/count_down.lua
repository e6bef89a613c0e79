-- Count a latch down by one; at zero the round is open: the latch is gone and its waiters are
-- told which round opened ('@GRANT@<round>:0:@LATCH@', as a grant names its token): a waiter of
-- that round (or an earlier one) goes without looking again, so an opening costs one message
-- per waiting client and no read, and is heard even while the slot migrates (a read of the
-- moved key would wait for the migration's end). A latch without a round id (none can be
-- made now) is told to look again ('@FREE@').
--
-- KEYS[1]  latch hash  P:{N}  (see set_count.lua)
-- ARGV[1]  release channel  P:{N}:released
--
-- Replies: the count left (0: it just opened, or was open already). 'WRONGTYPE 1 ...' when the
-- key is not a hash; 'WRONGKIND <kind> latch' when the name is in use by another kind (nothing
-- changed).
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'none' then
  return 0
end
if kind ~= 'hash' then
  return redis.error_reply('WRONGTYPE 1 the latch key holds another type')
end
local held_as = redis.call('HGET', KEYS[1], '@KIND@') or 'lock'
if held_as ~= 'latch' then
  return redis.error_reply('WRONGKIND ' .. held_as .. ' latch')
end
local left = redis.call('HINCRBY', KEYS[1], '@LATCH@', -1)
if left <= 0 then
  local round = redis.call('HGET', KEYS[1], '@ROUND@')
  redis.call('DEL', KEYS[1])
  if round then
    redis.call('@PUBLISH@', ARGV[1], '@GRANT@' .. round .. ':0:@LATCH@')
  else
    redis.call('@PUBLISH@', ARGV[1], '@FREE@')
  end
  return 0
end
return left
