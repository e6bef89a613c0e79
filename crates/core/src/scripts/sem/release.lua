-- Give back one acquisition's permits, or settle a command whose reply never came; the
-- waiters whose permits are now there are told.
--
-- KEYS[1..6]  as in sem/common.lua
-- ARGV[1]     the acquisition's id
-- ARGV[2]     waiter channel prefix  P:{N}:released:
-- ARGV[3]     the token of its grant; '' for whichever grant the id has
-- ARGV[4]     '' for a release; to settle: the expected count (1 if the command ran)
-- ARGV[5]     when settling a waiter's try: its place in line ('' for none; keep_place.lua)
-- ARGV[6]     with ARGV[5]: its entry's lifetime in milliseconds
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
local wanted = tonumber(redis.call('HGET', KEYS[1], member))
drop_permit(member)
local owner, place, place_life = id, ARGV[5], tonumber(ARGV[6])
if place == '' then
  place = nil
end
@KEEP_PLACE@
if place then
  redis.call('HSET', KEYS[6], id, wanted)
  gone[3], gone[4], gone[6] = false, false, false
  keep_for(KEYS[6], place_life + 1000)
end
hand_on(false)
return 0
