-- Release one hold of a lock (plain or fair), or settle a command whose reply never came; the
-- last hold grants the lock to the first live waiter of its line.
--
-- KEYS[1]  lock hash        P:{N}
-- KEYS[2]  fence counter    P:{T}:fence
-- KEYS[3]  waiters          P:{N}:waiters
-- KEYS[4]  their deadlines  P:{N}:waiters:until
-- KEYS[5]  their leases     P:{N}:wants  (the fixed leases waiters asked for)
-- ARGV[1]  owner id
-- ARGV[2]  release channel  P:{N}:released (waiters hear on channels under it: ARGV[2] .. ':')
-- ARGV[3]  the token of the grant the hold must belong to; absent or '' for "the owner's grant"
--          (a plain release sends two arguments: each costs a Lua string on the hot path): the
--          client's hold table knows it is the current one (a release), or does not know it
--          (settling an acquire whose reply never came: it may have made a new grant)
-- ARGV[4]  absent or '' for a release. To settle an unanswered command: the hold count the
--          owner has if that command ran (an acquire) or did not run (a release); one hold is
--          released only then.
-- ARGV[5]  when settling a waiter's try: its place in line (absent or '': none; keep_place.lua)
-- ARGV[6]  with ARGV[5]: its entry's lifetime in milliseconds
-- ARGV[7]  'o' when waiters hear on their owner's channel (the fair lock); absent or '' on
--          their client's (the plain lock)
-- ARGV[8]  with ARGV[4]: 'a' when the command settled was an acquire (a waiter's try, or a
--          re-entry: then ARGV[3] names its grant), '' for a release
--
-- Replies (a bare integer: no reply table to build on either side):
--   remaining >= 0  one hold released; 0 means the last hold is gone: the first live waiter
--                   holds the lock now (line/hand_on.lua), or with nobody in line the lock is
--                   free and the release channel hears '@FREE@' (a RedLock's waiters listen
--                   there).
--   -1              the owner holds nothing here under that token (wrong owner, expired, force
--                   unlocked, double unlock, or a later grant); nothing changed.
--   -2              settling: the count differs, or an acquire's settle finds a grant the line
--                   made (not the acquire's doing), so there is nothing to undo; nothing changed.
--   error 'WRONGTYPE 1 ...'  the lock key holds another type.
--
-- A lock's hash has one owner (besides its '@FENCE@' and '@GRANTED@'), so the last hold hands
-- the hash on in place or deletes it. Nobody in line (the uncontended case) costs one EXISTS.
-- A foreign key where the line belongs must not stop a release: then nobody is handed on.
-- (The WRONGTYPE check after each pcall is written out where it is needed: a Lua helper
-- function would be a closure created on every call of the script.)

@RELEASE_HOLD@
if redis.call('EXISTS', KEYS[3]) == 1 or (ARGV[5] and ARGV[5] ~= '') then
  local line = redis.call('TYPE', KEYS[3])['ok']
  local deadlines = redis.call('TYPE', KEYS[4])['ok']
  local asked = redis.call('TYPE', KEYS[5])['ok']
  if (line == 'zset' or line == 'none') and (deadlines == 'zset' or deadlines == 'none')
      and (asked == 'hash' or asked == 'none') then
    local t = redis.call('TIME')
    local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    local prefix = ARGV[2] .. ':'
    local by_client = ARGV[7] ~= 'o'
    local both = false
    local owner, place, place_life = ARGV[1], ARGV[5], tonumber(ARGV[6])
    if place == '' then
      place = nil
    end
    @KEEP_PLACE@
    if place then
      -- (What lease the waiter asked for is not known here: its grant is a watched one's, and
      -- a waiter with a fixed lease takes it by a try.)
      redis.call('HSET', KEYS[5], owner, 'w')
      if redis.call('PTTL', KEYS[5]) < place_life + 1000 then
        redis.call('PEXPIRE', KEYS[5], place_life + 1000)
      end
    end
    local except, leaving = false, false
    local was_ms = redis.call('PTTL', KEYS[1])
    @HAND_ON@
    if head then
      return 0
    end
  end
end
redis.call('@PUBLISH@', ARGV[2], '@FREE@')
redis.call('DEL', KEYS[1])
return 0
