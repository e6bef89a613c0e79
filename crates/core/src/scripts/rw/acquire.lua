-- Acquire, re-enter or queue for a read/write lock's read or write side.
--
-- KEYS[1..5]  as in rw/common.lua: lock hash, fence counter, waiters, their deadlines, leases
-- ARGV[1]     owner id
-- ARGV[2]     lease in milliseconds
-- ARGV[3]     mode: 't' a try (never queues); 'w' a waiter's try (queues when not granted,
--             once: it keeps its place); 'r' re-enter the grant with token ARGV[4] (when that
--             grant is gone, a 't')
-- ARGV[4]     the token for 'r'; 'n' for a non-reentrant handle's try; else ''
-- ARGV[5]     waiter channel prefix  P:{N}:released:
-- ARGV[6]     entry lifetime in milliseconds (the watchdog lease)
-- ARGV[7]     'read' or 'write'
-- ARGV[8]     'f' for a fixed lease, '' for a watched one (the line grants a watched lease: a
--             waiter with a fixed one takes its grant with a try, which gives it that lease)
--
-- A release grants the waiters at the head (rw/common.lua's hand_on): a waiter's try that
-- finds such a grant for its owner on its side takes it as its own (a new token, the lease
-- it asks for).
--
-- The policy: one line in arrival order for readers and writers. A writer enters when nobody
-- holds the lock and it is first in line; a reader enters while no writer holds it and no
-- writer waits before it, so a waiting writer stops readers that come after it (writers do not
-- starve), and readers that came before a writer go before it (readers do not starve either).
-- The owner of the write lock may always take a read lock (downgrade). A reader asking for the
-- write lock is refused at once: it would wait for itself.
--
-- Replies, as the plain acquire's: a new grant's token; {hold_count, token} for a re-entry;
-- {0, pttl} when busy, pttl bounding how long that stays so without a message to this waiter;
-- a waiter's try adds its place in the line, its rank and a fresh fencing token ({0, pttl,
-- place, rank, token}: a grant message with a larger token was made after this try; see
-- sem/acquire.lua).
-- Errors: 'WRONGTYPE <i> ...'; 'UPGRADE ...' for a reader asking for the write lock.

local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local prefix = ARGV[5]
@RW_COMMON@

local refused = wrong_type()
if refused then
  return refused
end
local owner, lease, mode, side = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[7]
local reading = side == 'read'
local count_field = reading and (READ .. owner) or owner
local fence_field = reading and ('@READ_FENCE@' .. owner) or '@FENCE@'

prune()

-- Extends this owner's hold on `side` to at least a lease from now (never shortens it).
local function extend()
  local until_ms = now_ms + lease
  local current = redis.call('ZSCORE', KEYS[5], count_field)
  if not current or tonumber(current) < until_ms then
    redis.call('ZADD', KEYS[5], until_ms, count_field)
  end
  keep_until_latest()
end

-- A grant the line made to this waiter is taken as its own: a new token, and the lease it asks
-- for. (Its hold is in the leases zset: no script emptied it.) It keeps its mark, so that the
-- settle of this try, should its reply be lost, leaves it (line/acquire.lua says why).
local mark = granted_mark(count_field)
if mode == 'w' and redis.call('HEXISTS', KEYS[1], mark) == 1
    and redis.call('HEXISTS', KEYS[1], count_field) == 1 then
  local fence = next_fence()
  redis.call('HSET', KEYS[1], fence_field, fence)
  zrem(3, {owner})
  zrem(4, {owner})
  extend()
  return finish(fence)
end

if mode == 'r' then
  local fields = redis.call('HMGET', KEYS[1], count_field, fence_field)
  if fields[1] and fields[2] == ARGV[4]
      and (reading or redis.call('HGET', KEYS[1], '@WRITER@') == owner) then
    zrem(3, {owner})
    zrem(4, {owner})
    local count = redis.call('HINCRBY', KEYS[1], count_field, 1)
    extend()
    return finish({count, fields[2]})
  end
  mode = 't'
end

local writer = redis.call('HGET', KEYS[1], '@WRITER@')
if not reading and writer ~= owner and redis.call('HEXISTS', KEYS[1], READ .. owner) == 1 then
  return finish(redis.error_reply(
    'UPGRADE the owner holds a read lock: it cannot wait for the write lock'))
end
local held = has_members(5)

-- Is anyone in line before this owner that it must let go first? A writer lets everyone before
-- it go; a reader, only writers.
local function someone_before()
  if gone[3] then
    return false
  end
  local mine = redis.call('ZSCORE', KEYS[3], owner)
  local before
  if mine then
    if not reading then
      return redis.call('ZRANK', KEYS[3], owner) > 0
    end
    before = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. mine, 'WITHSCORES')
  else
    if not reading then
      return has_members(3)
    end
    before = redis.call('ZRANGE', KEYS[3], 0, -1, 'WITHSCORES')
  end
  for i = 2, #before, 2 do
    if is_writer(before[i]) then
      return true
    end
  end
  return false
end

local may
if reading then
  -- A writer's own read (downgrade), or no writer holds and none waits before.
  may = writer == owner or (not writer and not someone_before())
  -- (A read hold of this owner that the client never saw is replaced below, as an orphan.)
else
  -- Nobody else holds it (this owner's unseen grant is replaced), and nobody waits before it.
  local others = held and not (writer == owner and redis.call('ZCARD', KEYS[5]) ==
    1 + redis.call('HEXISTS', KEYS[1], READ .. owner))
  may = not others and not someone_before()
end

-- A non-reentrant handle's try (ARGV[4] 'n') never replaces a hold of its owner on this side as
-- an orphan: another future of the owner's task may hold it, and two acquires of one owner
-- must never both be granted. The answer is busy until that hold ends.
if may and ARGV[4] == 'n' and redis.call('HEXISTS', KEYS[1], count_field) == 1 then
  may = false
end

if may then
  -- The fence first, before any other write (see acquire.lua). Then the new hold's lease: a
  -- leases zset this script emptied (its last lease ran out just now) cannot be written again
  -- while the slot migrates (rw/common.lua), and that stops the script there, before the grant
  -- changed anything else.
  local fence = next_fence()
  redis.call('ZADD', KEYS[5], now_ms + lease, count_field)
  gone[5] = false
  zrem(3, {owner})
  zrem(4, {owner})
  local fields = {count_field, '1', fence_field, fence, '@KIND@', 'rw'}
  if not reading then
    fields[#fields + 1] = '@WRITER@'
    fields[#fields + 1] = owner
  end
  -- A waiter's grant is marked as the line's (line/acquire.lua says why); a try's is not (an
  -- orphan of this owner replaced: a mark it may carry goes).
  if mode == 'w' then
    fields[#fields + 1] = mark
    fields[#fields + 1] = '1'
  end
  redis.call('HSET', KEYS[1], unpack(fields))
  if mode ~= 'w' then
    redis.call('HDEL', KEYS[1], mark)
  end
  if not held then
    -- A spent hash: its old fields go, the key stays (rw/common.lua).
    local kept = {['@MODE@'] = true}
    for i = 1, #fields, 2 do
      kept[fields[i]] = true
    end
    keep_only(kept)
  end
  spent = false
  fix_mode()
  keep_until_latest()
  return fence
end

if not held then
  -- Free, but others were first: they are granted (a waiter ahead gave up, or its hold lapsed).
  hand_on(owner)
end

if mode == 'w' then
  -- Writers' scores are odd: the line tells readers and writers apart.
  local life, line_step, line_tag = tonumber(ARGV[6]), 2, reading and 0 or 1
  @JOIN_LINE@
  gone[3], gone[4] = false, false
end

-- How long this stays so at most without a message to this waiter: until the first hold's
-- lease ends, or the first waiter's entry would lapse (a dead waiter ahead).
-- A spent hash is deleted below: -2, as for no hash.
local bound = spent and -2 or redis.call('PTTL', KEYS[1])
local first_hold = not gone[5] and redis.call('ZRANGE', KEYS[5], 0, 0, 'WITHSCORES')[2]
if first_hold then
  bound = tonumber(first_hold) - now_ms
end
local first_entry = not gone[4] and redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')[2]
if first_entry and (bound < 0 or tonumber(first_entry) - now_ms < bound) then
  bound = tonumber(first_entry) - now_ms
end
if mode == 'w' then
  return finish({0, math.max(bound, 1), redis.call('ZSCORE', KEYS[3], owner),
    redis.call('ZRANK', KEYS[3], owner), next_fence()})
end
return finish({0, math.max(bound, 1)})
