-- (Inlined by the read/write lock's scripts where they name it.) The key layout and the helper
-- functions they share. The read/write lock is not the plain lock's hottest path, so these are
-- functions: clarity over the closure each costs per call.
--
-- KEYS[1]  lock hash  P:{N}   '@MODE@' -> 'r' or 'w'; while a writer holds: '@WRITER@' -> its
--                             owner id, <owner id> -> its hold count, '@FENCE@' -> its token;
--                             per reader: '@READ@<owner>' -> read hold count and
--                             '@READ_FENCE@<owner>' -> that read grant's token. A writer may
--                             hold reads too (downgrade). A hold the line granted (a release
--                             handed it to a waiter) is marked until the waiter's own try takes
--                             it: '@GRANTED@' beside a writer's, '@GRANTED@:@READ@<owner>'
--                             beside a reader's.
-- KEYS[2]  fence counter      P:{T}:fence (as the plain lock's)
-- KEYS[3]  waiters            P:{N}:waiters        owner -> arrival * 2 + 1 for a writer, + 0
--                                                  for a reader (arrival: server microseconds)
-- KEYS[4]  their deadlines    P:{N}:waiters:until  owner -> server ms (renewed by the watchdog)
-- KEYS[5]  hold leases        P:{N}:leases         the writer's owner id, or '@READ@<owner>'
--                                                  -> that hold's deadline (server ms): every
--                                                  hold has its own lease; the hash and this
--                                                  zset live as long as the latest one.
-- Needs `t` (server TIME), `now_ms` (server time in ms) and `prefix` (the waiter channel
-- prefix P:{N}:released:).
--
-- The line's helpers are line/common.lua's. The hash is not deleted when its last hold goes:
-- it is `spent`, a hold granted in it later replaces its fields in place, and otherwise
-- `finish` deletes it as the script's last command on that key (a hash the script deleted
-- could not be written again while the slot migrates).

@LINE_COMMON@

local READ = '@READ@'
-- Whether the hash's last hold went in this script (the hash is then deleted by `finish`,
-- unless a hold is granted in it first).
local spent = false

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

-- Drops one hold's fields (its mark too, for a grant of the line never taken), but not its
-- lease: see drop_hold.
local function drop_hold_fields(member)
  if string.sub(member, 1, #READ) == READ then
    local owner = string.sub(member, #READ + 1)
    redis.call('HDEL', KEYS[1], member, '@READ_FENCE@' .. owner, '@GRANTED@:' .. member)
  else
    redis.call('HDEL', KEYS[1], member, '@FENCE@', '@WRITER@', '@GRANTED@')
  end
end

-- Drops one hold's fields and its lease (a member of KEYS[5]).
local function drop_hold(member)
  drop_hold_fields(member)
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

-- The mark of a hold the line granted: beside a writer's hold, or a reader's (`count_field`).
local function granted_mark(count_field)
  if string.sub(count_field, 1, #READ) == READ then
    return '@GRANTED@:' .. count_field
  end
  return '@GRANTED@'
end

-- Grants the waiter `who` its read or write hold, as a release grants a lock's head
-- (line/hand_on.lua): a new token, the mark, and a lease until its entry would have lapsed (a
-- waiter that died meanwhile holds it no longer than its entry would have held its place; one
-- that asked for a fixed lease takes the grant with a try, which gives it that lease). Only it
-- is told, on its own channel: '@GRANT@<token>:<lease ms>:<field>', the field its hold is
-- counted in (its owner id for the write side, '@READ@<owner>' for the read side).
local function grant(who, reading)
  local lease = grant_lease(who, nil)
  local fence = next_fence()
  local count_field = reading and (READ .. who) or who
  redis.call('ZADD', KEYS[5], now_ms + lease, count_field)
  local fields = {count_field, '1', granted_mark(count_field), '1', '@KIND@', 'rw'}
  if reading then
    fields[#fields + 1] = '@READ_FENCE@' .. who
    fields[#fields + 1] = fence
  else
    for _, field in ipairs({'@FENCE@', fence, '@WRITER@', who}) do
      fields[#fields + 1] = field
    end
  end
  redis.call('HSET', KEYS[1], unpack(fields))
  spent = false
  tell_granted(who, fence, lease, count_field)
end

-- Grants the waiters at the head of the line what they wait for, after a change (a release, a
-- waiter leaving, a try that found it free): while no writer holds, the readers before the
-- first waiting writer are granted all at once; with no hold at all and a writer first in
-- line, that writer. Each is told on its own channel, however many there are (read 100 at a
-- time), and leaves the line. `except`: an owner not to grant (the caller), or false;
-- `releasing`: how many members of KEYS[5] the caller takes out after this, holds it gives up
-- (their fields are gone already; their leases go after the grants are written, so that the
-- leases zset is never emptied and written again), or nil for none.
--
-- When this script emptied the leases zset itself (every hold lapsed, or a force unlock), no
-- grant can be written there while the slot migrates: the head waiters are told to look
-- again ('@FREE@') instead, and their own tries take the lock.
local function hand_on(except, releasing)
  -- (With the leases zset gone, no hold is left, whatever fields the hash still has.)
  if gone[3] or (not gone[5] and redis.call('HEXISTS', KEYS[1], '@WRITER@') == 1) then
    return
  end
  local held = not gone[5] and redis.call('ZCARD', KEYS[5]) > (releasing or 0)
  local granted = {}
  walk(function(who, score)
    local reading = not is_writer(score)
    -- A writer only first in line and with no hold left (each reader before it is one).
    if not reading and held then
      return false
    end
    if who ~= except then
      if gone[5] then
        redis.call('@PUBLISH@', prefix .. who, '@FREE@')
      else
        grant(who, reading)
        granted[#granted + 1] = who
      end
    end
    held = true
    return reading
  end)
  zrem(3, granted)
  zrem(4, granted)
  if #granted > 0 then
    fix_mode()
  end
end

-- Refuses keys of another type and a name in use by another kind of lock (line/common.lua).
local function wrong_type()
  return refuse_other_kinds({'hash', 'string', 'zset', 'zset', 'zset'}, 'rw', 'read/write lock')
end
