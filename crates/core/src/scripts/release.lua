-- Release one hold of a reentrant lock.
--
-- KEYS[1]  lock hash   P:{N}
-- KEYS[2]  turn queue  P:{N}:queue
-- ARGV[1]  owner id
-- ARGV[2]  release channel  P:{N}:released
--
-- The turn grace (25 ms, `TURN_GRACE` in commands.rs, which a test keeps equal) is written
-- here rather than sent: arguments cost on the hottest path.
--
-- Replies (a bare integer: no reply table to build on either side):
--   remaining >= 0  one hold released; 0 means the last hold is gone and the release was
--                   published. With clients queued, the lock is reserved for the head's
--                   turn for the grace period ('~turn:<client id>' as the only field) and the
--                   message names that client: another process releasing and asking again at
--                   once cannot barge in ahead of waiters. With nobody queued the lock is free
--                   and the message is '*' (one waiter per client wakes).
--   -1              the owner holds nothing here (wrong owner, expired, double unlock); nothing
--                   changed.
--   error WRONGTYPE the key holds another type.
--
-- An exclusive lock's hash has one owner (besides its '~fence'), so the last hold deletes the
-- key. The message goes out before the delete: if the ACL refuses the channel, nothing is
-- released.
local count = redis.pcall('HGET', KEYS[1], ARGV[1])
if type(count) == 'table' then
  return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' is not a lock')
end
if not count then
  return -1
end
-- Counts are written by HSET '1' and HINCRBY, so they are canonical decimal text.
if count ~= '1' then
  return redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
end
-- EXISTS first: with nobody queued (the uncontended case) ZPOPMIN's empty reply table is not
-- built. pcall: a foreign key where the queue belongs must not stop a release; it is ignored.
local head
if redis.call('EXISTS', KEYS[2]) == 1 then
  local popped = redis.pcall('ZPOPMIN', KEYS[2])
  head = type(popped) == 'table' and not popped.err and popped[1] or nil
end
redis.call('PUBLISH', ARGV[2], head or '*')
redis.call('DEL', KEYS[1])
if head then
  redis.call('HSET', KEYS[1], '~turn:' .. head, '0')
  redis.call('PEXPIRE', KEYS[1], '25')
end
return 0
