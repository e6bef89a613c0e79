-- (Inlined where a lock's script names it: a Lua function would be a closure
-- created on every call.) A lock (plain or fair) whose hold is over is granted to the first
-- live waiter of its line: the release grants, and the waiter wakes holding the lock.
--
-- Needs: KEYS[1] the lock hash (absent, or with fields that are all over: a hold released, a
-- grant given up), KEYS[2] the fence counter, KEYS[3] the line, KEYS[4] the entries'
-- deadlines, KEYS[5] the leases they asked for (one field per entry: a fixed lease in ms, or
-- 'w' for a watched one; it lives and goes with the entries, so that a line's keys exist
-- together, which a migrating Cluster slot asks of a script's keys), `t` (server TIME), `now_ms`, `prefix` (the
-- waiter channel prefix P:{N}:released:), `by_client` (true: a waiter hears on its client's
-- channel, prefix .. client id, as the plain lock's do; false: on its owner's, prefix ..
-- owner id, as the fair lock's do), `both` (true: on both, for a caller that cannot tell the
-- two kinds apart), `was_ms` (what was left of the lock's lease before: its PTTL, negative when
-- unknown or free), `except` (an owner not to grant, being granted by the caller, or false) and
-- `leaving` (an owner whose entry goes too, a waiter giving up, or false). Leaves `head` (the
-- first live waiter other than `leaving`, nil when nobody waits); returns the error reply when
-- the fence counter holds another type, before anything was written.
--
-- Dead waiters (a deadline in the past: their client stopped renewing the entry) are dropped
-- first. The head (unless it is `except`) is then granted: its hold (count 1), a new fencing
-- token, and the '@GRANTED@' mark (the line made this grant: the head's own next try takes it
-- as its own, and a head that gave up before it heard hands it on when it leaves). Its lease
-- is the one the head asked for when it asked for a fixed one (KEYS[5]); otherwise (a watched
-- lease, renewed by the head's watchdog) it ends when the head's entry would have lapsed, so a
-- head that died meanwhile holds the lock no longer than its entry would have held the line.
-- The head leaves the line, and only it is told, on its own channel, with the grant's token
-- and lease ('@GRANT@<token>:<lease ms>:<owner>'). A fixed lease shorter than what was left of
-- the lock's lease may end before the bound the next waiter sleeps on (the old holder's lease):
-- then that waiter is told to look again ('@FREE@'). A watched grant needs no such message: it
-- lasts until the head's entry would have lapsed, and every waiter's bound is at most the
-- earliest entry deadline it saw. With no head
-- to grant (or the head `except`), the hash is left as it was: a caller whose lock is over
-- deletes it, as its last command on that key.
--
-- While the slot migrates (Redis Cluster), Redis stops a script half-way ("non local key") at
-- the first command that names a key the script itself emptied. So the hash is never deleted
-- and written again: the grant is written first, then the old fields go. And the line is read
-- before any entry goes (dropping the entries can empty its zsets): the head is the first
-- entry that stays, which is among the first #gone + 1.
local head
do
  local gone = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now_ms, 'LIMIT', 0, 100)
  if leaving then
    gone[#gone + 1] = leaving
  end
  local first = redis.call('ZRANGE', KEYS[3], 0, #gone + 1)
  local dropped = {}
  for _, who in ipairs(gone) do
    dropped[who] = true
  end
  local after
  for _, who in ipairs(first) do
    if not dropped[who] then
      if head then
        after = who
        break
      end
      head = who
    end
  end
  if head and head ~= except then
    local asked = tonumber(redis.call('HGET', KEYS[5], head))
    local lease = asked
    if not lease then
      lease = math.max(tonumber(redis.call('ZSCORE', KEYS[4], head) or now_ms) - now_ms, 1)
    end
    @NEXT_FENCE@
    local old = redis.call('HKEYS', KEYS[1])
    redis.call('HSET', KEYS[1], head, '1', '@FENCE@', fence, '@GRANTED@', '1')
    for i = #old, 1, -1 do
      if old[i] == head or old[i] == '@FENCE@' or old[i] == '@GRANTED@' then
        table.remove(old, i)
      end
    end
    if #old > 0 then
      redis.call('HDEL', KEYS[1], unpack(old))
    end
    redis.call('PEXPIRE', KEYS[1], lease)
    gone[#gone + 1] = head
    local grant = '@GRANT@' .. fence .. ':' .. lease .. ':' .. head
    if by_client or both then
      redis.call('@PUBLISH@', prefix .. string.match(head, '^[^:]*'), grant)
    end
    if both or not by_client then
      redis.call('@PUBLISH@', prefix .. head, grant)
    end
    if asked and after and (was_ms < 0 or lease < was_ms) then
      if by_client then
        after = string.match(after, '^[^:]*')
      end
      redis.call('@PUBLISH@', prefix .. after, '@FREE@')
    end
  end
  if #gone > 0 then
    redis.call('ZREM', KEYS[3], unpack(gone))
    redis.call('ZREM', KEYS[4], unpack(gone))
    redis.call('HDEL', KEYS[5], unpack(gone))
  end
end
