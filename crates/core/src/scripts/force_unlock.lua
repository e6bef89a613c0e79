-- Release a lock whoever holds it, and wake its waiters (operator's escape hatch).
--
-- KEYS[1]  lock hash  P:{N}
-- KEYS[2]  fence counter              P:{T}:fence
-- KEYS[3]  waiters                    P:{N}:waiters
-- KEYS[4]  their deadlines            P:{N}:waiters:until
-- KEYS[5]  read/write lock leases     P:{N}:leases; for a lock (plain or fair), the leases its
--          waiters asked for  P:{N}:wants
-- ARGV[1]  release channel  P:{N}:released
-- ARGV[2]  waiter channel prefix  P:{N}:released:
-- ARGV[3]  'rw' when the caller knows it is a read/write lock (a hash without '@KIND@' is a
--          lock's), 'o' for a fair lock (its waiters hear
--          on their owner's channel), 'c' for a plain lock (on their client's), '' for a lock
--          of either kind (a plain and a fair lock keep the same keys: both are told)
--
-- Replies: 1 a lock was removed (and '@FREE@' published on the release channel; a lock's first
-- live waiter is granted it, as by a release; every hold of a read/write lock is removed and
-- the head of its line granted, as by a release); 0 there was none.
-- error 'WRONGTYPE 1 ...' the key holds another type (it is not ours to delete); 'WRONGKIND
-- <kind> lock' the name is a semaphore's or a latch's (left alone).
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'none' then
  return 0
end
if kind ~= 'hash' then
  return redis.error_reply('WRONGTYPE 1 the key holds a ' .. kind .. ', not a lock')
end
-- A semaphore's or a latch's hash is not a lock's: deleting it would drop its number of
-- permits (and orphan their leases) or open the latch. Left alone.
local held_as = redis.call('HGET', KEYS[1], '@KIND@')
if held_as and held_as ~= 'rw' then
  return redis.error_reply('WRONGKIND ' .. held_as .. ' lock')
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local prefix = ARGV[2]
local read_write = ARGV[3] == 'rw' or held_as == 'rw'
redis.call('@PUBLISH@', ARGV[1], '@FREE@')
local line = redis.call('TYPE', KEYS[3])['ok'] == 'zset'
  and redis.call('TYPE', KEYS[4])['ok'] == 'zset'
if read_write then
  @RW_COMMON@
  -- Every hold goes and the head of the line is granted the lock, as by a release: the holds'
  -- fields first, then the grants, then the old holds' leases (a leases zset this script
  -- emptied could not be written while the slot migrates: rw/common.lua), the hash last
  -- (`finish`) when nobody was granted.
  local old = {}
  if redis.call('TYPE', KEYS[5])['ok'] == 'zset' then
    old = redis.call('ZRANGE', KEYS[5], 0, -1)
  else
    gone[5] = true
  end
  for _, member in ipairs(old) do
    drop_hold_fields(member)
  end
  spent = true
  if line then
    -- Dead waiters first (their client stopped renewing the entry): the head must be live.
    local dead = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now_ms, 'LIMIT', 0, 100)
    zrem(3, dead)
    zrem(4, dead)
    hand_on(false, #old)
  end
  zrem(5, old)
  if keep_until_latest() then
    fix_mode()
  end
  return finish(1)
end
-- The first live waiter of the line is granted the lock, in the hash in place
-- (line/hand_on.lua says why); otherwise the hash is deleted, last.
local asked = redis.call('TYPE', KEYS[5])['ok']
if line and (asked == 'hash' or asked == 'none') then
  local by_client = ARGV[3] == 'c'
  local both = ARGV[3] == ''
  local except, leaving = false, false
  local was_ms = redis.call('PTTL', KEYS[1])
  @HAND_ON@
  if head then
    return 1
  end
end
redis.call('DEL', KEYS[1])
return 1
