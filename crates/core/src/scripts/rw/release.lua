-- Release one read or write hold of a read/write lock, or settle a command whose reply never
-- came; when that changes who may enter, the head of the line is told (rw/common.lua hand_on).
--
-- KEYS[1..5]  as in rw/common.lua
-- ARGV[1]     owner id
-- ARGV[2]     waiter channel prefix  P:{N}:released:
-- ARGV[3]     the token of the grant the hold must belong to; '' for the owner's grant
-- ARGV[4]     '' for a release; to settle: the expected hold count (see release.lua)
-- ARGV[5]     'read' or 'write'
--
-- Replies as release.lua's: remaining >= 0 released; -1 not held under that token; -2
-- settling found another count. Error 'WRONGTYPE <i> ...'.

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
local fields = redis.call('HMGET', KEYS[1], count_field, fence_field, '@WRITER@')
local count = fields[1]
if not count or (not reading and fields[3] ~= owner) then
  return -1
end
if ARGV[3] ~= '' and fields[2] ~= ARGV[3] then
  return -1
end
if ARGV[4] ~= '' and count ~= ARGV[4] then
  return -2
end
if count ~= '1' then
  return redis.call('HINCRBY', KEYS[1], count_field, -1)
end
drop_hold(count_field)
if keep_until_latest() then
  fix_mode()
end
prune()
hand_on(false)
return 0
