-- A semaphore's waiter gives up: its entry goes at once, and a grant the line made to it that
-- its client never took (the release ran before the waiter heard of it) passes on. The waiters
-- at the head whose permits are there (it may have been a large request at the head) are
-- granted them.
--
-- KEYS[1..6]  as in sem/common.lua
-- ARGV[1]     the waiter's id
-- ARGV[2]     waiter channel prefix  P:{N}:released:
-- ARGV[3]     the token of the grant its client holds ('' for none): a grant of the line with
--             another token was never taken
--
-- Replies 1 when a grant was passed on, else 0. Keys of another type are left alone.
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local prefix = ARGV[2]
@SEM_COMMON@

if wrong_type() then
  return 0
end
local id = ARGV[1]
drop_waiters({id})
prune()
local member = READ .. id
local fields = redis.call('HMGET', KEYS[1], member, '@READ_FENCE@' .. id, GRANTED .. id)
if fields[1] and fields[3] and fields[2] ~= ARGV[3] then
  -- Granted first, counting its permits as there (see sem/release.lua), then given back.
  hand_on(id, tonumber(fields[1]))
  drop_permit(member)
  return 1
end
hand_on(false)
return 0
