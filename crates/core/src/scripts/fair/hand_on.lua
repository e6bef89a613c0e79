-- (Inlined by the fair scripts where they name it: a Lua function would be a closure created
-- on every call.) Hands a free fair lock to the first live waiter, if any.
--
-- Needs: KEYS[1] the lock hash (free: deleted or never there), KEYS[3] the waiters zset,
-- KEYS[4] their deadlines, `now_ms` (server time), `prefix` (the waiter channel prefix
-- P:{N}:released:), `except` (an owner not to hand to, being granted by the caller, or false).
-- Leaves `head` (the first live waiter, nil when nobody waits) and `reserved_ms`.
--
-- Dead waiters (a deadline in the past: their client stopped renewing the entry) are dropped
-- first. The lock is then reserved for the head ('@TURN@<owner>' as the only field) until the
-- head's own entry would lapse (at least the turn grace): a live head takes it within a round
-- trip of the message; a head that died meanwhile holds the line no longer than its entry. The
-- message goes to the head's own channel: nobody else wakes.
local head
local reserved_ms = 0
do
  local dead = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now_ms, 'LIMIT', 0, 100)
  if #dead > 0 then
    redis.call('ZREM', KEYS[3], unpack(dead))
    redis.call('ZREM', KEYS[4], unpack(dead))
  end
  head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if head and head ~= except then
    local until_ms = tonumber(redis.call('ZSCORE', KEYS[4], head) or now_ms)
    reserved_ms = math.max(until_ms - now_ms, @GRACE_MS@)
    redis.call('HSET', KEYS[1], '@TURN@' .. head, '0')
    redis.call('PEXPIRE', KEYS[1], reserved_ms)
    redis.call('@PUBLISH@', prefix .. head, '@FREE@')
  end
end
