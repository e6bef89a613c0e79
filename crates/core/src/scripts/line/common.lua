-- (Inlined first by the semaphore's and the read/write lock's common pieces, whose helpers are
-- functions.) What every line with an entry per waiter shares, besides the kind's own fields:
-- the keys a script emptied, walking the line from its head, refusing another kind's keys, and
-- what every grant the line makes writes and says (a new fencing token, the waiter's lease,
-- one message on the waiter's channel). (The lock's line/hand_on.lua does the same inline: its
-- scripts are the hot path, and a Lua function is a closure created on every call.)
--
-- Needs `t` (server TIME), `now_ms`, `prefix` (the waiter channel prefix P:{N}:released:),
-- KEYS[2] (the fence counter), KEYS[3] (the line: waiter -> arrival) and KEYS[4] (the entries'
-- deadlines).
--
-- While the slot migrates (Redis Cluster), Redis stops a script half-way ("non local key") at
-- the first command that names a key the script itself emptied, as a zset whose last member it
-- removed. So the helpers note the zsets they empty (`gone`) and name them no more. (A script
-- that writes a zset it emptied, a waiter joining a line that dropping dead entries emptied, is
-- still stopped there: before its own changes.)

-- The keys among KEYS[3..] that this script emptied (index -> true): they are gone.
local gone = {}

-- Removes `members` (a list) from the zset KEYS[i], noting when that empties it.
local function zrem(i, members)
  if gone[i] or #members == 0 then
    return
  end
  local size = redis.call('ZCARD', KEYS[i])
  gone[i] = redis.call('ZREM', KEYS[i], unpack(members)) == size
end

-- Calls `visit(who, score)` for the line's waiters in order, from its head, until it returns
-- false or the line ends (read 100 at a time: a long line costs no more than its head needs).
local function walk(visit)
  local from = 0
  while not gone[3] do
    local line = redis.call('ZRANGE', KEYS[3], from, from + 99, 'WITHSCORES')
    for i = 1, #line, 2 do
      if not visit(line[i], line[i + 1]) then
        return
      end
    end
    if #line < 200 then
      return
    end
    from = from + 100
  end
end

-- Refuses keys of another type than `want` (a list of TYPE names, by key index):
-- 'WRONGTYPE <i> a <what> key holds another type'; and a name in use by another kind (its hash
-- is not marked '@KIND@' = `marker`): 'WRONGKIND <kind> <marker>'. Nil when all is fine. Every
-- hash of these kinds carries its marker: the calls that create it write it.
local function refuse_other_kinds(want, marker, what)
  for i = 1, #want do
    local kind = redis.call('TYPE', KEYS[i])['ok']
    if kind ~= 'none' and kind ~= want[i] then
      return redis.error_reply('WRONGTYPE ' .. i .. ' a ' .. what .. ' key holds another type')
    end
  end
  if redis.call('EXISTS', KEYS[1]) == 1 then
    local held_as = redis.call('HGET', KEYS[1], '@KIND@') or 'lock'
    if held_as ~= marker then
      return redis.error_reply('WRONGKIND ' .. held_as .. ' ' .. marker)
    end
  end
  return nil
end

-- The next fencing token. (The fence piece's error reply for a counter of another type cannot
-- come here: refuse_other_kinds() refused that before anything was written.)
local function next_fence()
  @NEXT_FENCE@
  return fence
end

-- The lease a waiter is granted: the fixed one it asked for (`fixed`, ms), or until its entry
-- would have lapsed, so that a waiter that died meanwhile holds the grant no longer than its
-- entry would have held its place.
local function grant_lease(who, fixed)
  if fixed then
    return fixed
  end
  local until_ms = not gone[4] and redis.call('ZSCORE', KEYS[4], who)
  return math.max(tonumber(until_ms or now_ms) - now_ms, 1)
end

-- Tells the waiter `who`, on its own channel, of its grant: '@GRANT@<token>:<lease ms>:<field>',
-- `field` naming what its hold is counted in.
local function tell_granted(who, fence, lease, field)
  redis.call('@PUBLISH@', prefix .. who, '@GRANT@' .. fence .. ':' .. lease .. ':' .. field)
end
