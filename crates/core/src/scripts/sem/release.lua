-- Give back one acquisition's permits, or settle a command whose reply never came; the
-- waiters at the head whose permits are now there are granted them (sem/common.lua's hand_on).
--
-- KEYS[1..6]  as in sem/common.lua
-- ARGV[1]     the acquisition's id
-- ARGV[2]     waiter channel prefix  P:{N}:released:
-- ARGV[3]     the token of its grant; '' for whichever grant the id has
-- ARGV[4]     '' for a release; to settle: the expected count (1 if the command ran)
-- ARGV[5]     when settling a waiter's try: its place in line ('' for none; keep_place.lua)
-- ARGV[6]     with ARGV[5]: its entry's lifetime in milliseconds
-- ARGV[7]     with ARGV[4]: 'a' when the command settled was an acquire (a waiter's try)
--
-- Replies: 0 released; -1 the id holds no permits (unknown, expired, or the semaphore was
-- deleted); -2 settling found nothing to undo: no permits, or an acquire's settle finds a grant
-- the line made (a release granted the waiter while its try went unanswered: not the try's
-- doing; the waiter takes it, or hands it on when it leaves). Error 'WRONGTYPE <i> ...'.
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
if ARGV[4] ~= '' and ARGV[7] == 'a' and ARGV[3] == ''
    and redis.call('HEXISTS', KEYS[1], GRANTED .. id) == 1 then
  return -2
end
local wanted = tonumber(fields[1])
local owner, place, place_life = id, ARGV[5], tonumber(ARGV[6])
if place == '' then
  place = nil
end
if not place then
  -- The grants first, counting these permits as there: giving them back may empty the leases
  -- zset, which a grant could then not write while the slot migrates.
  hand_on(id, wanted)
  drop_permit(member)
  return 0
end
-- A settle that takes a waiter's grant back puts the waiter where it stood in line, and the
-- hand-on may grant it again (under the same id: so its permits go first).
drop_permit(member)
@KEEP_PLACE@
redis.call('HSET', KEYS[6], id, wanted)
gone[3], gone[4], gone[6] = false, false, false
keep_for(KEYS[6], place_life + 1000)
hand_on(false)
return 0
