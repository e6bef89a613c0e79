-- Release one read or write hold of a read/write lock, or settle a command whose reply never
-- came; when that lets someone in, the head of the line is granted it (rw/common.lua hand_on).
--
-- KEYS[1..5]  as in rw/common.lua
-- ARGV[1]     owner id
-- ARGV[2]     waiter channel prefix  P:{N}:released:
-- ARGV[3]     the token of the grant the hold must belong to; '' for the owner's grant
-- ARGV[4]     '' for a release; to settle: the expected hold count (see release.lua)
-- ARGV[5]     'read' or 'write'
-- ARGV[6]     when settling a waiter's try: its place in line ('' for none; keep_place.lua)
-- ARGV[7]     with ARGV[6]: its entry's lifetime in milliseconds
-- ARGV[8]     with ARGV[4]: 'a' when the command settled was an acquire (a waiter's try)
--
-- Replies as release.lua's: remaining >= 0 released; -1 not held under that token (or its
-- lease ended: the hold is gone even while the hash lives on for another hold); -2 settling
-- found another count, or an acquire's settle found a hold the line granted (not the
-- acquire's doing: the waiter takes it, or hands it on when it leaves). Errors
-- 'WRONGTYPE <i> ...', 'WRONGKIND <kind> rw'.

local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local prefix = ARGV[2]
@RW_COMMON@

local refused = wrong_type()
if refused then
  return refused
end
local owner = ARGV[1]
local reading = ARGV[5] == 'read'
local count_field = reading and (READ .. owner) or owner
local fence_field = reading and ('@READ_FENCE@' .. owner) or '@FENCE@'
-- Expired holds go first: a hold whose lease ended is not held, even while the hash lives on
-- for another holder's longer lease.
local pruned = prune()
-- A refusal changes nothing of this owner's, but what the prune freed is handed on.
local function refuse(code)
  if pruned then
    hand_on(false)
  end
  return finish(code)
end
local fields = redis.call('HMGET', KEYS[1], count_field, fence_field, '@WRITER@')
local count = fields[1]
if not count or (not reading and fields[3] ~= owner) then
  return refuse(-1)
end
if ARGV[3] ~= '' and fields[2] ~= ARGV[3] then
  return refuse(-1)
end
if ARGV[4] ~= '' and count ~= ARGV[4] then
  return refuse(-2)
end
-- (A fresh acquire's settle, without a token: a re-entry's grant is the client's, maybe taken
-- from its message with the mark still on.)
if ARGV[4] ~= '' and ARGV[8] == 'a' and ARGV[3] == ''
    and redis.call('HEXISTS', KEYS[1], granted_mark(count_field)) == 1 then
  return refuse(-2)
end
if count ~= '1' then
  return finish(redis.call('HINCRBY', KEYS[1], count_field, -1))
end
local place, place_life = ARGV[6], tonumber(ARGV[7])
if place == '' then
  place = nil
end
if place then
  -- A settle that takes a waiter's grant back puts the waiter where it stood in line, and the
  -- hand-on may grant it again (under the same fields: so its hold goes first).
  drop_hold(count_field)
  @KEEP_PLACE@
  gone[3], gone[4] = false, false
  hand_on(false)
else
  -- The grants first, the released hold's lease last (rw/common.lua's hand_on says why).
  drop_hold_fields(count_field)
  hand_on(false, 1)
  zrem(5, {count_field})
end
if keep_until_latest() then
  fix_mode()
end
return finish(0)
