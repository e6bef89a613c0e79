-- A semaphore's waiter gives up: its entry goes at once, and the waiters after it whose
-- permits are there (it may have been a large request at the head) are told.
--
-- KEYS[1..6]  as in sem/common.lua
-- ARGV[1]     the waiter's id
-- ARGV[2]     waiter channel prefix  P:{N}:released:
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local prefix = ARGV[2]
@SEM_COMMON@

if wrong_type() then
  return 0
end
drop_waiters({ARGV[1]})
prune()
hand_on(false)
return 0
