-- A waiter of a lock's line gives up (cancelled, timed out, or its wait failed): its entry goes
-- at once, and a grant the line made to it that its client never took (the release ran before
-- the waiter heard of it) passes to the next live waiter.
--
-- KEYS[1]  lock hash        P:{N}
-- KEYS[2]  fence counter    P:{T}:fence
-- KEYS[3]  waiters          P:{N}:waiters
-- KEYS[4]  their deadlines  P:{N}:waiters:until
-- KEYS[5]  their leases     P:{N}:wants
-- ARGV[1]  owner id
-- ARGV[2]  waiter channel prefix  P:{N}:released:
-- ARGV[3]  the token of the owner's grant its client holds ('' for none): a grant of the line
--          with another token was never taken
-- ARGV[4]  'c' when waiters hear on their client's channel (the plain lock), '' on their
--          owner's (the fair lock)
--
-- Replies 1 when a grant was passed on (or, with nobody to take it, the lock deleted), else 0.
-- Keys of another type are left alone.
-- (Absent line keys are fine: the release that granted this waiter may have emptied the line.)
for i = 3, 4 do
  local kind = redis.call('TYPE', KEYS[i])['ok']
  if kind ~= 'zset' and kind ~= 'none' then
    return 0
  end
end
local asked = redis.call('TYPE', KEYS[5])['ok']
if asked ~= 'hash' and asked ~= 'none' then
  return 0
end
local untaken = false
if redis.call('TYPE', KEYS[1])['ok'] == 'hash' then
  local fields = redis.call('HMGET', KEYS[1], ARGV[1], '@FENCE@', '@GRANTED@')
  untaken = fields[1] == '1' and fields[3] ~= false and fields[2] ~= ARGV[3]
end
if not untaken then
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('ZREM', KEYS[4], ARGV[1])
  redis.call('HDEL', KEYS[5], ARGV[1])
  return 0
end
-- The grant passes on: the hand-on takes the leaving waiter's entry out with the dead ones (it
-- reads the line first: taking the entry out can empty it) and grants the hash in place to the
-- next waiter; with nobody to hand to, the hash is deleted last (hand_on.lua says why).
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local prefix = ARGV[2]
local by_client = ARGV[4] == 'c'
local both = false
local except, leaving = false, ARGV[1]
local was_ms = redis.call('PTTL', KEYS[1])
@HAND_ON@
if not head then
  redis.call('DEL', KEYS[1])
end
return 1
