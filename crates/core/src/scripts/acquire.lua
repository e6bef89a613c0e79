-- Acquire, or re-enter, a reentrant lock.
--
-- KEYS[1]  lock hash       P:{N}          owner id -> hold count, '@FENCE@' -> the grant's token
-- KEYS[2]  fence counter   P:{T}:fence    string, no TTL, one per Cluster slot (T hashes to N's)
-- ARGV[1]  owner id
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  mode, absent for a plain try (try_lock, a waiter's first try; a waiting plain
--          lock's later tries are line/acquire.lua's); otherwise:
--   'n'    a plain try of a non-reentrant lock: a hold of ARGV[1] keeps the lock busy
--   'r'    re-enter: the client holds this lock under ARGV[1] with the token ARGV[4]
--
-- The plain try sends only what a grant needs: every argument costs encoding on the client and
-- a Lua string on the server, on the hottest path there is.
--
-- Replies (the common one is a bare value: no reply table to build on either side):
--   fence                a new grant (hold count 1), its fencing token as decimal text (or an
--                        integer): the counter was raised to max(stored + 1, server TIME in
--                        microseconds), and the hash keeps the token for re-entries.
--   {hold_count, fence}  a re-entry (hold_count >= 2) of the grant with that token. It never
--                        shortens the remaining lease.
--   {0, pttl}            held by another owner; pttl is the remaining lease of the hold (-1: no
--                        TTL). (A plain try does not look at the line: a lock that is free with
--                        waiters in line, which only a lease that ran out leaves, goes to the
--                        first try that comes; a release always grants the line's head.)
--   error 'WRONGTYPE <i> ...'  KEYS[i] holds a value of another type. Nothing else was changed
--                        (the fence counter may have risen, which is harmless).
--   error 'WRONGKIND <kind> lock'  the name is in use by another kind (its hash has '@KIND@':
--                        a read/write lock, a semaphore or a latch); nothing was changed.
--
-- A hold of ARGV[1] that the client does not re-enter on purpose (mode other than 'r' with the
-- grant's token) is an orphan: a grant whose reply the client never saw. It is replaced by a new
-- grant with a new token, never re-entered: the client's hold count would not match Redis's.
-- A non-reentrant lock's try ('n') never replaces one: its owner may hold the lock through
-- another future of the same task, and the answer is "busy" until that ends.
-- (The WRONGTYPE check after each pcall is written out where it is needed: a Lua helper
-- function would be a closure created on every call of the script.)

local pttl = redis.call('PTTL', KEYS[1])
local mode = ARGV[3]
local fresh = pttl == -2

if not fresh then
  if mode == 'r' then
    local fields = redis.pcall('HMGET', KEYS[1], ARGV[1], '@FENCE@', '@KIND@')
    if fields.err then
      if string.sub(fields.err, 1, 9) == 'WRONGTYPE' then
        return redis.error_reply('WRONGTYPE 1 the lock key holds another type')
      end
      return fields
    end
    if fields[3] then
      return redis.error_reply('WRONGKIND ' .. fields[3] .. ' lock')
    end
    if fields[1] and fields[2] == ARGV[4] then
      local count = redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
      if pttl < tonumber(ARGV[2]) then
        redis.call('PEXPIRE', KEYS[1], ARGV[2])
      end
      return {count, fields[2]}
    end
    -- Held by this owner under another grant: an orphan (replaced below).
    fresh = fields[1] and true or false
  else
    -- The owner's field and the kind marker in one read (the busy path of every contended
    -- try): a name in use by another kind (it has '@KIND@') is refused before anything is
    -- written.
    local fields = redis.pcall('HMGET', KEYS[1], ARGV[1], '@KIND@')
    if fields.err then
      if string.sub(fields.err, 1, 9) == 'WRONGTYPE' then
        return redis.error_reply('WRONGTYPE 1 the lock key holds another type')
      end
      return fields
    end
    if fields[2] then
      return redis.error_reply('WRONGKIND ' .. fields[2] .. ' lock')
    end
    if fields[1] then
      -- An orphan, replaced below; or, for a non-reentrant lock, this owner's live hold.
      fresh = mode ~= 'n'
    end
  end
end

if fresh then
  -- The next fencing token, before any other write: a failure leaves the lock as it was
  -- (next_fence.lua).
  local t = redis.call('TIME')
  @NEXT_FENCE@
  if pttl ~= -2 then
    -- An orphan replaced: its fields go but the key stays, for a slot that migrates (Redis
    -- Cluster) stops a script that deletes a key and writes it again ("non local key").
    local old = redis.call('HKEYS', KEYS[1])
    redis.call('HSET', KEYS[1], ARGV[1], '1', '@FENCE@', fence)
    for i = 1, #old do
      if old[i] ~= ARGV[1] and old[i] ~= '@FENCE@' then
        redis.call('HDEL', KEYS[1], old[i])
      end
    end
  else
    redis.call('HSET', KEYS[1], ARGV[1], '1', '@FENCE@', fence)
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return fence
end

return {0, pttl}
