-- A waiter of a read/write lock gives up (cancelled or timed out): its entry goes at once, a
-- hold the line granted it that its client never took (the release ran before the waiter heard
-- of it) is given up, and the head of the line is granted what that lets in (a writer that left
-- may have kept readers behind it waiting).
--
-- KEYS[1..5]  as in rw/common.lua
-- ARGV[1]     owner id
-- ARGV[2]     waiter channel prefix  P:{N}:released:
-- ARGV[3]     the token of the read grant its client holds ('' for none), ARGV[4] the write
--             grant's: a grant of the line with another token was never taken (an owner's two
--             sides share its entry, and a grant taken stays marked as the line's)
--
-- Replies 1 when a grant was passed on, else 0. Keys of another type are left alone.
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local prefix = ARGV[2]
@RW_COMMON@

if wrong_type() then
  return 0
end
local owner = ARGV[1]
zrem(3, {owner})
zrem(4, {owner})
prune()
-- Its untaken grant, on either side (an owner waits on one side at a time: the other is a
-- re-entry or a downgrade, granted at once, or refused as an upgrade).
local untaken
for _, side in ipairs({{READ .. owner, '@READ_FENCE@' .. owner, ARGV[3]},
    {owner, '@FENCE@', ARGV[4]}}) do
  local fields = redis.call('HMGET', KEYS[1], side[1], side[2], granted_mark(side[1]))
  if fields[1] and fields[3] and fields[2] ~= side[3]
      and (side[1] ~= owner or redis.call('HGET', KEYS[1], '@WRITER@') == owner) then
    untaken = side[1]
  end
end
if untaken then
  drop_hold_fields(untaken)
  hand_on(false, 1)
  zrem(5, {untaken})
  if keep_until_latest() then
    fix_mode()
  end
  return finish(1)
end
hand_on(false)
return finish(0)
