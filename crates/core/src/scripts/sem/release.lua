-- Give back one acquisition's permits, or settle a command whose reply never came; the
-- waiters whose permits are now there are told.
--
-- KEYS[1..6]  as in sem/common.lua
-- ARGV[1]     the acquisition's id
-- ARGV[2]     waiter channel prefix  P:{N}:released:
-- ARGV[3]     the token of its grant; '' for whichever grant the id has
-- ARGV[4]     '' for a release; to settle: the expected count (1 if the command ran)
--
-- Replies: 0 released; -1 the id holds no permits (unknown, expired, or the semaphore was
-- deleted); -2 settling found nothing to undo. Error 'WRONGTYPE <i> ...'.
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local prefix = ARGV[2]
@SEM_COMMON@

local refused = wrong_type()
if refused then
  return refused
end
local id = ARGV[1]
local member = READ .. id
prune()
local fields = redis.call('HMGET', KEYS[1], member, '@READ_FENCE@' .. id)
if not fields[1] then
  return ARGV[4] ~= '' and -2 or -1
end
if ARGV[3] ~= '' and fields[2] ~= ARGV[3] then
  return -1
end
drop_permit(member)
hand_on(false)
return 0
