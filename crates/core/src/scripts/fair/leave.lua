-- A waiter of a fair lock gives up (cancelled or timed out): its entry goes at once, and a turn
-- reserved for it passes to the next live waiter.
--
-- KEYS[1]  lock hash        P:{N}
-- KEYS[2]  (unused)
-- KEYS[3]  waiters          P:{N}:waiters
-- KEYS[4]  their deadlines  P:{N}:waiters:until
-- ARGV[1]  owner id
-- ARGV[2]  waiter channel prefix  P:{N}:released:
--
-- Replies 1 when a reserved turn was passed on, else 0. Keys of another type are left alone.
for i = 3, 4 do
  if redis.call('TYPE', KEYS[i])['ok'] ~= 'zset' then
    return 0
  end
end
if redis.call('TYPE', KEYS[1])['ok'] ~= 'hash'
    or redis.call('HEXISTS', KEYS[1], '@TURN@' .. ARGV[1]) == 0 then
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('ZREM', KEYS[4], ARGV[1])
  return 0
end
-- The turn passes on: the hand-on takes the leaving waiter's entry out with the dead ones (it
-- reads the line first: taking the entry out can empty it) and reserves the hash in place for
-- the next waiter; with nobody to hand to, the hash is deleted last (hand_on.lua says why).
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local prefix = ARGV[2]
local except, leaving = false, ARGV[1]
@HAND_ON@
if not head then
  redis.call('DEL', KEYS[1])
end
return 1
