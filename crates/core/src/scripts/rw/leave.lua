-- A waiter of a read/write lock gives up (cancelled or timed out): its entry goes at once, a
-- turn reserved for it is given up, and the head of the line is told when that lets someone
-- in (a writer that left may have kept readers behind it waiting).
--
-- KEYS[1..5]  as in rw/common.lua
-- ARGV[1]     owner id
-- ARGV[2]     waiter channel prefix  P:{N}:released:
--
-- Replies 0. Keys of another type are left alone.
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local prefix = ARGV[2]
@RW_COMMON@

if wrong_type() then
  return 0
end
zrem(3, {ARGV[1]})
zrem(4, {ARGV[1]})
if not has_members(5) and redis.call('HEXISTS', KEYS[1], '@TURN@' .. ARGV[1]) == 1 then
  -- Its turn is given up: the hash is spent (a turn reserved for the next writer replaces it;
  -- otherwise it is deleted last).
  spent = true
end
prune()
if has_members(5) or spent or redis.call('EXISTS', KEYS[1]) == 0 then
  hand_on(false)
end
return finish(0)
