-- (Inlined by the read/write lock's scripts where they name it.) The key layout and the helper
-- functions they share. The read/write lock is not the plain lock's hottest path, so these are
-- functions: clarity over the closure each costs per call.
--
-- KEYS[1]  lock hash  P:{N}   '@MODE@' -> 'r' or 'w'; while a writer holds: '@WRITER@' -> its
--                             owner id, <owner id> -> its hold count, '@FENCE@' -> its token;
--                             per reader: '@READ@<owner>' -> read hold count and
--                             '@READ_FENCE@<owner>' -> that read grant's token. A writer may
--                             hold reads too (downgrade). With no holds: '@TURN@<owner>' while
--                             reserved for a waiting writer's turn, or no key.
-- KEYS[2]  fence counter      P:{T}:fence (as the plain lock's)
-- KEYS[3]  waiters            P:{N}:waiters        owner -> arrival * 2 + 1 for a writer, + 0
--                                                  for a reader (arrival: server microseconds)
-- KEYS[4]  their deadlines    P:{N}:waiters:until  owner -> server ms (renewed by the watchdog)
-- KEYS[5]  hold leases        P:{N}:leases         the writer's owner id, or '@READ@<owner>'
--                                                  -> that hold's deadline (server ms): every
--                                                  hold has its own lease; the hash and this
--                                                  zset live as long as the latest one.
-- Needs `now_ms` (server time) and `prefix` (the waiter channel prefix P:{N}:released:).
--
-- While the slot migrates (Redis Cluster), Redis stops a script half-way ("non local key") at
-- the first command that names a key the script itself emptied: a zset whose last member it
-- removed, a hash it deleted. So the helpers note the zsets they empty (`gone`) and name them
-- no more, and the hash is not deleted when its last hold goes: it is `spent`, a turn reserved
-- or a hold granted in it later replaces its fields in place, and otherwise `finish` deletes
-- it as the script's last command on that key. (A script that writes a zset it emptied, a
-- waiter joining a line that dropping dead entries emptied, is still stopped there: before its
-- own changes.)

local READ = '@READ@'

-- The zsets among KEYS[3..5] that this script emptied (index -> true): their keys are gone.
local gone = {}
-- Whether the hash's last hold went in this script (the hash is then deleted by `finish`,
-- unless a turn is reserved or a hold granted in it first).
local spent = false

-- Removes `members` (a list) from the zset KEYS[i], noting when that empties it.
local function zrem(i, members)
  if gone[i] or #members == 0 then
    return
  end
  local size = redis.call('ZCARD', KEYS[i])
  gone[i] = redis.call('ZREM', KEYS[i], unpack(members)) == size
end

-- Whether the zset KEYS[i] has members (a zset this script emptied is not asked).
local function has_members(i)
  return not gone[i] and redis.call('EXISTS', KEYS[i]) == 1
end

-- Removes the hash's fields other than `kept` (field -> true), after the fields that stay were
-- written: the hash is replaced in place, never emptied on the way.
local function keep_only(kept)
  local stale = {}
  for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
    if not kept[field] then
      stale[#stale + 1] = field
    end
  end
  if #stale > 0 then
    redis.call('HDEL', KEYS[1], unpack(stale))
  end
end

-- Ends a script after a change: deletes a spent hash, as the script's last command on it.
-- Returns `reply`.
local function finish(reply)
  if spent then
    redis.call('DEL', KEYS[1])
  end
  return reply
end

-- Sets the hash's and the leases' TTL to the latest lease; when no hold is left the hash is
-- spent (and the leases zset is gone already). Returns whether a hold is left.
local function keep_until_latest()
  local latest = not gone[5] and redis.call('ZRANGE', KEYS[5], -1, -1, 'WITHSCORES')[2]
  if not latest then
    spent = true
    return false
  end
  local ttl = math.max(tonumber(latest) - now_ms, 1)
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('PEXPIRE', KEYS[5], ttl)
  return true
end

-- Drops one hold's fields and its lease (a member of KEYS[5]).
local function drop_hold(member)
  if string.sub(member, 1, #READ) == READ then
    local owner = string.sub(member, #READ + 1)
    redis.call('HDEL', KEYS[1], member, '@READ_FENCE@' .. owner)
  else
    redis.call('HDEL', KEYS[1], member, '@FENCE@', '@WRITER@')
  end
  zrem(5, {member})
end

-- The mode after a change: 'w' while a writer holds, else 'r' while a reader does.
local function fix_mode()
  if redis.call('HEXISTS', KEYS[1], '@WRITER@') == 1 then
    redis.call('HSET', KEYS[1], '@MODE@', 'w')
  elseif has_members(5) then
    redis.call('HSET', KEYS[1], '@MODE@', 'r')
  end
end

-- Holds whose lease ran out (a crashed reader or writer) go; so do waiters whose entry was not
-- renewed (their client is gone). Returns whether a hold went.
local function prune()
  local expired = {}
  if not gone[5] then
    expired = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now_ms, 'LIMIT', 0, 100)
  end
  for _, member in ipairs(expired) do
    drop_hold(member)
  end
  if #expired > 0 and keep_until_latest() then
    fix_mode()
  end
  if not gone[4] then
    local dead = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now_ms, 'LIMIT', 0, 100)
    zrem(3, dead)
    zrem(4, dead)
  end
  return #expired > 0
end

-- Whether a waiter's score is a writer's.
local function is_writer(score)
  return tonumber(score) % 2 == 1
end

-- Tells the waiters at the head of the line that they may go, after a change (a release, a
-- waiter leaving): while no writer holds, the readers before the first waiting writer are told
-- all at once; with no hold at all and a writer first in line, the lock is reserved for that
-- writer (until its entry would lapse, at least the turn grace) and only it is told. Each is
-- told on its own channel, however many there are (read 100 at a time). `except`: an owner
-- not to tell (it is being granted), or false.
local function hand_on(except)
  local held = has_members(5)
  if (held and redis.call('HGET', KEYS[1], '@MODE@') == 'w') or gone[3] then
    return
  end
  local from = 0
  while true do
    local line = redis.call('ZRANGE', KEYS[3], from, from + 99, 'WITHSCORES')
    for i = 1, #line, 2 do
      local who = line[i]
      if is_writer(line[i + 1]) then
        if from == 0 and i == 1 and not held and who ~= except then
          local until_ms = now_ms
          if not gone[4] then
            until_ms = tonumber(redis.call('ZSCORE', KEYS[4], who) or now_ms)
          end
          -- The turn replaces whatever the hash held, in place.
          local turn = '@TURN@' .. who
          redis.call('HSET', KEYS[1], turn, '0', '@KIND@', 'rw')
          keep_only({[turn] = true, ['@KIND@'] = true})
          redis.call('PEXPIRE', KEYS[1], math.max(until_ms - now_ms, @GRACE_MS@))
          spent = false
          redis.call('@PUBLISH@', prefix .. who, '@FREE@')
        end
        return
      end
      if who ~= except then
        redis.call('@PUBLISH@', prefix .. who, '@FREE@')
      end
    end
    if #line < 200 then
      return
    end
    from = from + 100
  end
end

-- Refuses keys of another type ('WRONGTYPE <i> ...') and a name in use by another kind of
-- lock ('WRONGKIND <kind> rw': its hash is not marked '@KIND@' = 'rw'); nil when all is fine.
-- Every read/write lock hash carries the marker: the grants and the reservations write it.
local function wrong_type()
  local want = {'hash', nil, 'zset', 'zset', 'zset'}
  for _, i in ipairs({1, 3, 4, 5}) do
    local kind = redis.call('TYPE', KEYS[i])['ok']
    if kind ~= 'none' and kind ~= want[i] then
      return redis.error_reply('WRONGTYPE ' .. i .. ' a read/write lock key holds another type')
    end
  end
  if redis.call('EXISTS', KEYS[1]) == 1 then
    local held_as = redis.call('HGET', KEYS[1], '@KIND@') or 'lock'
    if held_as ~= 'rw' then
      return redis.error_reply('WRONGKIND ' .. held_as .. ' rw')
    end
  end
  return nil
end
