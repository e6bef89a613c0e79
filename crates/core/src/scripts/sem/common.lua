-- (Inlined by the semaphore's scripts where they name it.) The key layout and the helper
-- functions they share.
--
-- KEYS[1]  semaphore hash  P:{N}   '@PERMITS@' -> the number of permits (kept until the
--                                  semaphore is deleted: it is configuration), '@USED@' ->
--                                  permits taken now; per acquired permit (its id is an owner
--                                  id): '@READ@<id>' -> how many permits it holds,
--                                  '@READ_FENCE@<id>' -> its fencing token, and
--                                  '@GRANTED@:<id>' while the grant is one the line made
--                                  (the waiter's own try takes it as its own)
-- KEYS[2]  fence counter           P:{T}:fence (as the locks')
-- KEYS[3]  waiters                 P:{N}:waiters        id -> arrival (server microseconds)
-- KEYS[4]  their deadlines         P:{N}:waiters:until  id -> server ms (renewed by the
--                                                       watchdog)
-- KEYS[5]  permit leases           P:{N}:leases         '@READ@<id>' -> that permit's deadline
--                                                       (server ms); no TTL, like the hash:
--                                                       an expired permit stays listed until
--                                                       a call gives it back
-- KEYS[6]  what each waiter wants  P:{N}:wants          id -> number of permits, and
--                                                       ':<ms>' after it for a fixed lease
--                                                       (renewed with the waiters' entries)
-- Needs `t` (server TIME), `now_ms` (server time in ms) and `prefix` (the waiter channel
-- prefix P:{N}:released:).
--
-- The line's helpers are line/common.lua's. What the waiters want has an entry per waiter in
-- line: it is taken as emptied with the line. (The hash is never emptied: it keeps the number
-- of permits and the kind.)

@LINE_COMMON@

local READ = '@READ@'
local GRANTED = '@GRANTED@:'

-- Takes waiters (a list of ids) out of the line: their entries, deadlines and wants.
local function drop_waiters(ids)
  zrem(3, ids)
  zrem(4, ids)
  if not gone[6] and #ids > 0 then
    redis.call('HDEL', KEYS[6], unpack(ids))
    gone[6] = gone[3]
  end
end

-- The permits not taken (negative when the number was lowered below what is taken).
local function available()
  local fields = redis.call('HMGET', KEYS[1], '@PERMITS@', '@USED@')
  return tonumber(fields[1] or '0') - tonumber(fields[2] or '0')
end

-- Lengthens a key's TTL to `ttl` ms (never shortens it).
local function keep_for(key, ttl)
  if redis.call('PTTL', key) < ttl then
    redis.call('PEXPIRE', key, ttl)
  end
end

-- Gives one acquisition's permits back.
local function drop_permit(member)
  local id = string.sub(member, #READ + 1)
  local count = redis.call('HGET', KEYS[1], member)
  if count then
    redis.call('HINCRBY', KEYS[1], '@USED@', -tonumber(count))
    redis.call('HDEL', KEYS[1], member, '@READ_FENCE@' .. id, GRANTED .. id)
  end
  zrem(5, {member})
end

-- Permits whose lease ran out (their holder crashed or stalled) return to the pool; waiters
-- whose entry was not renewed (their client is gone) leave the line.
local function prune()
  if not gone[5] then
    local expired = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now_ms, 'LIMIT', 0, 100)
    for _, member in ipairs(expired) do
      drop_permit(member)
    end
  end
  if not gone[4] then
    drop_waiters(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now_ms, 'LIMIT', 0, 100))
  end
end

-- What a waiter wants (1 when unknown), and the fixed lease it asked for (nil: a watched one).
local function wants(id)
  if gone[6] then
    return 1
  end
  local asked = redis.call('HGET', KEYS[6], id)
  if not asked then
    return 1
  end
  local n, lease = string.match(asked, '^(%d+):?(%d*)$')
  return tonumber(n) or 1, tonumber(lease)
end

-- Grants the waiters at the head of the line whose permits are there, in order: the first,
-- and each next one while what they want together fits (a large request at the head is not
-- overtaken by small ones). Each is granted as a release grants a lock's head
-- (line/hand_on.lua): its permits, a new fencing token, the '@GRANTED@:<id>' mark, and its
-- lease (a fixed one as asked; a watched one until its entry would have lapsed, so a waiter
-- that died meanwhile holds its permits no longer than its entry would have held its place);
-- it leaves the line and only it is told, on its own channel ('@GRANT@<token>:<lease>:<id>').
-- `except`: a waiter not to grant (the caller), or false; `extra`: permits about to be given
-- back by the caller, counted as there (it gives them back after: a leases zset emptied by
-- this script could not be written again while the slot migrates).
--
-- A fixed lease may end before the bound the next waiter sleeps on (the earliest lease it
-- saw): that waiter is told to look again. When this script emptied the leases zset itself
-- (every permit lapsed), no grant can be written there while the slot migrates: the head
-- waiters are told to look again instead, and their own tries take the permits.
local function hand_on(except, extra)
  local left = available() + (extra or 0)
  local granted, short = {}, false
  if left > 0 then
    walk(function(who)
      local n, lease = wants(who)
      left = left - n
      if left < 0 then
        return false
      end
      if who ~= except then
        if gone[5] then
          redis.call('@PUBLISH@', prefix .. who, '@FREE@')
        else
          short = short or lease ~= nil
          lease = grant_lease(who, lease)
          local fence = next_fence()
          local member = READ .. who
          redis.call('ZADD', KEYS[5], now_ms + lease, member)
          redis.call('HSET', KEYS[1], member, n, '@READ_FENCE@' .. who, fence, GRANTED .. who, '1')
          redis.call('HINCRBY', KEYS[1], '@USED@', n)
          tell_granted(who, fence, lease, who)
          granted[#granted + 1] = who
        end
      end
      return left > 0
    end)
  end
  drop_waiters(granted)
  if short and not gone[3] then
    local after = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
    if after and after ~= except then
      redis.call('@PUBLISH@', prefix .. after, '@FREE@')
    end
  end
end

-- Refuses keys of another type and a name in use by another kind (line/common.lua).
local function wrong_type()
  return refuse_other_kinds({'hash', 'string', 'zset', 'zset', 'zset', 'hash'}, 'semaphore',
    'semaphore')
end
