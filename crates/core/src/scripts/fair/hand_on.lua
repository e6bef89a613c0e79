-- (Inlined by the fair scripts where they name it: a Lua function would be a closure created
-- on every call.) Hands a fair lock whose hold (or reserved turn) is over to the first live
-- waiter, if any.
--
-- Needs: KEYS[1] the lock hash (absent, or with fields that are all over: a hold released, a
-- turn given up), KEYS[3] the waiters zset, KEYS[4] their deadlines, `now_ms` (server time),
-- `prefix` (the waiter channel prefix P:{N}:released:), `except` (an owner not to hand to,
-- being granted by the caller, or false) and `leaving` (an owner whose entry goes too, a
-- waiter giving up, or false). Leaves `head` (the first live waiter other than `leaving`, nil
-- when nobody waits) and `reserved_ms`.
--
-- Dead waiters (a deadline in the past: their client stopped renewing the entry) are dropped
-- first. The lock is then reserved for the head ('@TURN@<owner>' as the only field) until the
-- head's own entry would lapse (at least the turn grace): a live head takes it within a round
-- trip of the message; a head that died meanwhile holds the line no longer than its entry. The
-- message goes to the head's own channel: nobody else wakes. With no head to reserve for (or
-- the head `except`), the hash is left as it was: a caller whose lock is over deletes it, as
-- its last command on that key.
--
-- While the slot migrates (Redis Cluster), Redis stops a script half-way ("non local key") at
-- the first command that names a key the script itself emptied. So the hash is never deleted
-- and written again: the turn is written first, then the old fields go. And the line is read
-- before any entry goes (dropping the entries can empty its zsets): the head is the first
-- entry that stays, which is among the first #gone + 1.
local head
local reserved_ms = 0
do
  local gone = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now_ms, 'LIMIT', 0, 100)
  if leaving then
    gone[#gone + 1] = leaving
  end
  local first = redis.call('ZRANGE', KEYS[3], 0, #gone)
  if #gone > 0 then
    local dropped = {}
    for _, who in ipairs(gone) do
      dropped[who] = true
    end
    for _, who in ipairs(first) do
      if not dropped[who] then
        head = who
        break
      end
    end
  else
    head = first[1]
  end
  local until_ms
  if head and head ~= except then
    until_ms = tonumber(redis.call('ZSCORE', KEYS[4], head) or now_ms)
  end
  if #gone > 0 then
    redis.call('ZREM', KEYS[3], unpack(gone))
    redis.call('ZREM', KEYS[4], unpack(gone))
  end
  if until_ms then
    reserved_ms = math.max(until_ms - now_ms, @GRACE_MS@)
    local turn = '@TURN@' .. head
    local old = redis.call('HKEYS', KEYS[1])
    redis.call('HSET', KEYS[1], turn, '0')
    for i = #old, 1, -1 do
      if old[i] == turn then
        table.remove(old, i)
      end
    end
    if #old > 0 then
      redis.call('HDEL', KEYS[1], unpack(old))
    end
    redis.call('PEXPIRE', KEYS[1], reserved_ms)
    redis.call('@PUBLISH@', prefix .. head, '@FREE@')
  end
end
