-- Release one hold of a reentrant lock, or settle a command whose reply never came.
--
-- KEYS[1]  lock hash   P:{N}
-- KEYS[2]  turn queue  P:{N}:queue
-- ARGV[1]  owner id
-- ARGV[2]  release channel  P:{N}:released
-- ARGV[3]  the token of the grant the hold must belong to; absent or '' for "the owner's grant"
--          (a plain release sends two arguments: each costs a Lua string on the hot path): the
--          client's hold table knows it is the current one (a release), or does not know it
--          (settling an acquire whose reply never came: it may have made a new grant)
-- ARGV[4]  absent for a release. To settle an unanswered command: the hold count the owner has
--          if that command ran (an acquire) or did not run (a release); one hold is released
--          only then.
--
-- Replies (a bare integer: no reply table to build on either side):
--   remaining >= 0  one hold released; 0 means the last hold is gone. With clients queued, the
--                   lock is reserved for the head's turn for the grace period ('@TURN@<client
--                   id>' as the only field) and the message names that client: another process
--                   releasing and asking again at once cannot barge in ahead of waiters. With
--                   nobody queued the lock is free and the message is '@FREE@'.
--   -1              the owner holds nothing here under that token (wrong owner, expired, force
--                   unlocked, double unlock, or a later grant); nothing changed.
--   -2              settling: the count differs, so there is nothing to undo; nothing changed.
--   error 'WRONGTYPE 1 ...'  the lock key holds another type.
--
-- An exclusive lock's hash has one owner (besides its '@FENCE@'), so the last hold deletes the
-- key. The message goes out before the delete: if the ACL refuses the channel, nothing is
-- released.
-- (The WRONGTYPE check after each pcall is written out where it is needed: a Lua helper
-- function would be a closure created on every call of the script.)

@RELEASE_HOLD@
-- EXISTS first: with nobody queued (the uncontended case) ZPOPMIN's empty reply table is not
-- built. pcall: a foreign key where the queue belongs must not stop a release; it is ignored.
local head
if redis.call('EXISTS', KEYS[2]) == 1 then
  local popped = redis.pcall('ZPOPMIN', KEYS[2])
  head = type(popped) == 'table' and not popped.err and popped[1] or nil
end
redis.call('@PUBLISH@', ARGV[2], head or '@FREE@')
if head then
  -- The reservation replaces the hash's fields without deleting the key: while the slot
  -- migrates (Redis Cluster), a script that deletes a key and then writes it again is stopped
  -- half-way ("non local key"), the turn never set.
  redis.call('HSET', KEYS[1], '@TURN@' .. head, '0')
  redis.call('HDEL', KEYS[1], ARGV[1], '@FENCE@')
  redis.call('PEXPIRE', KEYS[1], '@GRACE_MS@')
else
  redis.call('DEL', KEYS[1])
end
return 0
