-- Release one hold of a fair lock, or settle a command whose reply never came; the last hold
-- hands the lock to the first live waiter.
--
-- KEYS[1]  lock hash        P:{N}
-- KEYS[2]  (unused: keeps the waiters at 3 and 4, as in the fair acquire)
-- KEYS[3]  waiters          P:{N}:waiters
-- KEYS[4]  their deadlines  P:{N}:waiters:until
-- ARGV[1]  owner id
-- ARGV[2]  waiter channel prefix  P:{N}:released:
-- ARGV[3]  the token of the grant the hold must belong to; absent or '' for the owner's grant
-- ARGV[4]  absent for a release; to settle: the expected hold count (see release.lua)
-- ARGV[5]  when settling a waiter's try: its place in line ('' or absent: none; keep_place.lua)
-- ARGV[6]  with ARGV[5]: its entry's lifetime in milliseconds
--
-- Replies as release.lua's: remaining >= 0 released; -1 not held under that token; -2
-- settling found another count. Error 'WRONGTYPE 1 ...' when the lock key holds another type.

@RELEASE_HOLD@
-- The last hold goes. The hash is not deleted before the hand-on, which reserves it for the
-- next waiter's turn in place (hand_on.lua says why); with nobody to hand to it is deleted
-- last.
-- A foreign key where the waiters belong must not stop a release: then nobody is handed on.
local line = redis.call('TYPE', KEYS[3])['ok']
local deadlines = redis.call('TYPE', KEYS[4])['ok']
if (line == 'zset' or line == 'none') and (deadlines == 'zset' or deadlines == 'none') then
  local t = redis.call('TIME')
  local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local prefix = ARGV[2]
  local owner, place, place_life = ARGV[1], ARGV[5], tonumber(ARGV[6])
  if place == '' then
    place = nil
  end
  @KEEP_PLACE@
  local except, leaving = false, false
  @HAND_ON@
  if head then
    return 0
  end
end
redis.call('DEL', KEYS[1])
return 0
