-- Acquire permits of a semaphore, or queue for them: fair, in arrival order.
--
-- KEYS[1..6]  as in sem/common.lua
-- ARGV[1]     the acquisition's id (an owner id made for it)
-- ARGV[2]     lease in milliseconds
-- ARGV[3]     't' a try (never queues) or 'w' a waiter's try (queues when not granted, once)
-- ARGV[4]     ''
-- ARGV[5]     waiter channel prefix  P:{N}:released:
-- ARGV[6]     entry lifetime in milliseconds (the watchdog lease)
-- ARGV[7]     how many permits
-- ARGV[8]     'f' when ARGV[2] is a fixed lease (the line grants it as asked), '' for a watched
--             one (the line grants it until the waiter's entry would have lapsed)
--
-- A request is granted when its permits are there and every waiter before it in line can be
-- served too: nobody jumps the line, not even a releaser asking again, and a large request at
-- the head is not overtaken by small ones (tokio's Semaphore does the same).
--
-- A release grants the waiters at the head whose permits are there (sem/common.lua's hand_on):
-- a waiter's try that finds such a grant for its id takes it as its own.
--
-- Replies: the grant's fencing token; {0, bound} when not granted (bound: how long this stays
-- so at most without a message to this waiter; -1 when nothing bounds it, e.g. a semaphore
-- whose permits were never set); a waiter's try adds its place in the line, its rank and a
-- fresh fencing token ({0, bound, place, rank, token}: a grant message with a larger token was
-- made after this try; the token is drawn from the counter, which reads it with the command
-- every grant uses, and rises harmlessly).

local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local prefix = ARGV[5]
@SEM_COMMON@

local refused = wrong_type()
if refused then
  return refused
end
local id, lease, mode, n = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[7])
local member = READ .. id
prune()

-- Permits under this id already: a grant the line made to this waiter, which its try takes as
-- its own (a new token, the lease it asks for); or an acquisition whose reply the client never
-- saw, given back first (its guard never existed).
if redis.call('HEXISTS', KEYS[1], member) == 1 then
  if mode == 'w' and redis.call('HEXISTS', KEYS[1], GRANTED .. id) == 1 then
    local fence = next_fence()
    redis.call('ZADD', KEYS[5], now_ms + lease, member)
    -- (The mark stays: should this try's reply be lost, its settle leaves the grant.)
    redis.call('HSET', KEYS[1], '@READ_FENCE@' .. id, fence)
    return fence
  end
  drop_permit(member)
end

-- What the waiters before this one want.
local ahead = 0
local before = {}
if not gone[3] then
  local mine = redis.call('ZSCORE', KEYS[3], id)
  if mine then
    before = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. mine)
  else
    before = redis.call('ZRANGE', KEYS[3], 0, -1)
  end
end
for _, who in ipairs(before) do
  ahead = ahead + wants(who)
end

if available() - ahead >= n then
  local fence = next_fence()
  -- The permit's lease right after the fence: a leases zset this script emptied (its last
  -- permit given back above) cannot be written again while the slot migrates (sem/common.lua),
  -- and that stops the script there, before the grant changed anything else.
  -- (The leases zset keeps no TTL: like the hash, it lives with the semaphore, and an
  -- expired permit must stay listed until a call gives it back.)
  redis.call('ZADD', KEYS[5], now_ms + lease, member)
  gone[5] = false
  drop_waiters({id})
  redis.call('HSET', KEYS[1], member, n, '@READ_FENCE@' .. id, fence)
  -- A waiter's grant is marked as the line's (line/acquire.lua says why).
  if mode == 'w' then
    redis.call('HSET', KEYS[1], GRANTED .. id, '1')
  end
  redis.call('HINCRBY', KEYS[1], '@USED@', n)
  -- The next in line may fit in what is left.
  hand_on(id)
  return fence
end

if mode == 'w' then
  local owner, life, line_step, line_tag = id, tonumber(ARGV[6]), 1, 0
  @JOIN_LINE@
  redis.call('HSET', KEYS[6], id, ARGV[8] == 'f' and (n .. ':' .. lease) or n)
  gone[3], gone[4], gone[6] = false, false, false
  keep_for(KEYS[6], life + 1000)
end
-- Permits there for those before this one (a waiter ahead gave up, or the number was raised
-- by a call that could not grant): they are granted.
hand_on(id)

-- Until the first permit's lease or the first waiter's entry ends (a holder or a waiter ahead
-- that died), whichever is first.
local bound = -1
local first_permit = not gone[5] and redis.call('ZRANGE', KEYS[5], 0, 0, 'WITHSCORES')[2]
if first_permit then
  bound = tonumber(first_permit) - now_ms
end
local first_entry = not gone[4] and redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')[2]
if first_entry and (bound < 0 or tonumber(first_entry) - now_ms < bound) then
  bound = tonumber(first_entry) - now_ms
end
if bound ~= -1 then
  bound = math.max(bound, 1)
end
if mode == 'w' then
  return {0, bound, redis.call('ZSCORE', KEYS[3], id), redis.call('ZRANK', KEYS[3], id),
    next_fence()}
end
return {0, bound}
