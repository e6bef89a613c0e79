-- Acquire, re-enter, or wait in line for a lock: a fair lock's every try, and a plain lock's
-- tries while it waits (its first try is acquire.lua's). The line is in arrival order; a
-- release grants its head (line/hand_on.lua).
--
-- KEYS[1]  lock hash        P:{N}                 owner id -> hold count, '@FENCE@' -> the
--                                                 grant's token, '@GRANTED@' while the grant
--                                                 is one the line made
-- KEYS[2]  fence counter    P:{T}:fence           as acquire.lua's
-- KEYS[3]  waiters          P:{N}:waiters         zset: owner id -> arrival (server microseconds)
-- KEYS[4]  their deadlines  P:{N}:waiters:until   zset: owner id -> server milliseconds after
--                                                 which the entry is dead (renewed by the
--                                                 waiter's watchdog)
-- KEYS[5]  their leases     P:{N}:wants           hash: owner id -> the fixed lease (ms) a
--                                                 waiter asked for, or 'w' for a watched one
--                                                 (an entry's field comes and goes with it)
-- ARGV[1]  owner id
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  mode:
--   't'    a try (a fair lock's try_lock): granted only if the lock is free and nobody waits
--          (or this owner is first in line); never queues
--   'w'    a waiter's try: as 't', and when not granted the owner is queued (once: it keeps its
--          place); a grant the line made to this owner is taken as its own
--   'r'    re-enter the grant with token ARGV[4]; when that grant is gone, a plain 't'
-- ARGV[4]  for 'r' the token; otherwise 'n' for a non-reentrant handle, or ''
-- ARGV[5]  waiter channel prefix  P:{N}:released:
-- ARGV[6]  entry lifetime in milliseconds (the watchdog lease): a new entry's deadline
-- ARGV[7]  'c' when waiters hear on their client's channel (the plain lock), '' on their
--          owner's (the fair lock)
-- ARGV[8]  'f' when ARGV[2] is a fixed lease (the line grants it as asked), '' for a watched
--          one (the line grants it until the waiter's entry would have lapsed)
--
-- Replies, as the plain acquire's: a new grant's token; {hold_count, fence} for a re-entry;
-- {0, pttl} when busy: pttl bounds how long the lock stays as it is without a message to this
-- waiter (the holder's lease, or a dead waiter's entry ahead). A waiter's try ('w') adds its
-- place (its score in the line: a settle of a later try of this waiter whose reply never came
-- puts it back there, keep_place.lua), its rank, and the holder's token: a grant message with a
-- larger token was made after this try ({0, pttl, place, rank, token}).
-- Errors 'WRONGTYPE <i> ...' when KEYS[i] holds another type, 'WRONGKIND <kind> lock' when the
-- name is in use by another kind; nothing was changed then.

local owner = ARGV[1]
local mode = ARGV[3]
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local prefix = ARGV[5]
local by_client = ARGV[7] == 'c'
local both = false
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'none' and kind ~= 'hash' then
  return redis.error_reply('WRONGTYPE 1 the lock key holds another type')
end
for i = 3, 5 do
  local other = redis.call('TYPE', KEYS[i])['ok']
  if other ~= 'none' and other ~= (i == 5 and 'hash' or 'zset') then
    return redis.error_reply('WRONGTYPE ' .. i .. ' the waiters key holds another type')
  end
end
-- A name in use by another kind (a read/write lock, a semaphore, a latch) is refused before
-- anything is written: its line is not this lock's.
if kind == 'hash' then
  local held_as = redis.call('HGET', KEYS[1], '@KIND@')
  if held_as then
    return redis.error_reply('WRONGKIND ' .. held_as .. ' lock')
  end
end

if mode == 'r' then
  local fields = redis.call('HMGET', KEYS[1], owner, '@FENCE@')
  if fields[1] and fields[2] == ARGV[4] then
    -- A holder needs no place in line (a waiter of this owner that re-entered instead).
    redis.call('ZREM', KEYS[3], owner)
    redis.call('ZREM', KEYS[4], owner)
    redis.call('HDEL', KEYS[5], owner)
    local count = redis.call('HINCRBY', KEYS[1], owner, 1)
    if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
      redis.call('PEXPIRE', KEYS[1], ARGV[2])
    end
    return {count, fields[2]}
  end
  mode = 't'
end

-- May this owner take the lock now? It is free, or held by this owner under a grant the
-- client never saw: one the line made (its waiter takes it), or an orphan (a grant whose reply
-- was lost: replaced, as the plain lock does, unless the handle is non-reentrant).
local pttl = redis.call('PTTL', KEYS[1])
local free = pttl == -2
local mine, marked = false, false
if not free then
  local fields = redis.call('HMGET', KEYS[1], owner, '@GRANTED@')
  if fields[1] then
    marked = fields[2] ~= false
    mine = ARGV[4] ~= 'n' or (mode == 'w' and marked)
  end
end

if free or mine then
  local first = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if not mine and first and first ~= owner then
    -- Free, but others were first. Their deadlines decide who is still there: the lock goes
    -- to the first live one (granted, and told), or to this owner when it is that one.
    local except, leaving, was_ms = owner, false, pttl
    @HAND_ON@
    first = head
  end
  if mine or not first or first == owner then
    -- Granted. The fence first, before any other write (see acquire.lua).
    @NEXT_FENCE@
    redis.call('ZREM', KEYS[3], owner)
    redis.call('ZREM', KEYS[4], owner)
    redis.call('HDEL', KEYS[5], owner)
    -- A waiter's grant is marked as the line's: its try is the waiter's, which goes on
    -- waiting should the reply be lost, and takes the grant with its next try or hands it on
    -- when it leaves; the settle of that try leaves it (a rollback would cost the waiter its
    -- turn: its place went with the grant).
    marked = marked or mode == 'w'
    if free then
      redis.call('HSET', KEYS[1], owner, '1', '@FENCE@', fence)
      if marked then
        redis.call('HSET', KEYS[1], '@GRANTED@', '1')
      end
    else
      -- A grant of the line taken, or an orphan replaced: the old fields go but the key stays,
      -- for a slot that migrates (Redis Cluster) stops a script that deletes a key and writes it
      -- again ("non local key").
      local old = redis.call('HKEYS', KEYS[1])
      redis.call('HSET', KEYS[1], owner, '1', '@FENCE@', fence)
      if marked then
        redis.call('HSET', KEYS[1], '@GRANTED@', '1')
      end
      for i = 1, #old do
        if old[i] ~= owner and old[i] ~= '@FENCE@' and not (marked and old[i] == '@GRANTED@') then
          redis.call('HDEL', KEYS[1], old[i])
        end
      end
    end
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    if mode == 'w' then
      -- A waiter's own grant (its message was lost, its lease is not the line's, or it found
      -- the lock free) may end sooner than the bound the next waiter sleeps on: that waiter
      -- is told to look again. (A grant the line makes itself lasts at least that bound.)
      local after = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
      if after then
        if by_client then
          after = string.match(after, '^[^:]*')
        end
        redis.call('@PUBLISH@', prefix .. after, '@FREE@')
      end
    end
    return fence
  end
  pttl = redis.call('PTTL', KEYS[1])
end

if mode == 'w' then
  local life, line_step, line_tag = tonumber(ARGV[6]), 1, 0
  @JOIN_LINE@
  -- A fixed lease is granted as asked: the waiter wakes holding what it asked for.
  redis.call('HSET', KEYS[5], owner, ARGV[8] == 'f' and ARGV[2] or 'w')
  if redis.call('PTTL', KEYS[5]) < life + 1000 then
    redis.call('PEXPIRE', KEYS[5], life + 1000)
  end
end
-- The bound also covers a waiter that dies ahead of this one: its entry lapses at its
-- deadline, and nobody is told, so this waiter looks again then (a grant to a dead head lasts
-- no longer than its entry).
local first_entry = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')[2]
if first_entry and (pttl < 0 or tonumber(first_entry) - now_ms < pttl) then
  pttl = math.max(tonumber(first_entry) - now_ms, 1)
end
if mode == 'w' then
  -- The waiter's place, and how many wait before it (a waiter woken by a timer looks sooner
  -- the nearer the head it is).
  return {0, pttl, redis.call('ZSCORE', KEYS[3], owner), redis.call('ZRANK', KEYS[3], owner),
    redis.call('HGET', KEYS[1], '@FENCE@') or '0'}
end
return {0, pttl}
