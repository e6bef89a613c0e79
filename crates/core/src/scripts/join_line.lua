-- (Inlined where a script names it, inside `if mode == 'w' then`: a waiter keeps, or takes, its
-- place in a line of waiters.) Needs `t` (server TIME), `now_ms`, `owner` (the waiter),
-- `life` (its entry's lifetime in ms, the watchdog lease), KEYS[3] (the waiters, by arrival)
-- and KEYS[4] (their deadlines), and `line_step` and `line_tag`: a kind that tells its
-- waiters apart by score (a read/write lock: writers odd) scores arrival * step + tag.
--
-- Queued once, at the back: the arrival is server time in microseconds, made unique (two
-- arrivals in one microsecond keep their order). An entry dropped as dead comes back at the
-- back. The deadline becomes now + life. The zsets outlive their newest entry by a second, so
-- they go when every waiter is gone; their TTL is only ever lengthened, since another client's
-- entries may live longer (a longer lease).
do
  if not redis.call('ZSCORE', KEYS[3], owner) then
    local arrival = tonumber(t[1]) * 1000000 + tonumber(t[2])
    local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')[2]
    if last and math.floor(tonumber(last) / line_step) >= arrival then
      arrival = math.floor(tonumber(last) / line_step) + 1
    end
    redis.call('ZADD', KEYS[3], arrival * line_step + line_tag, owner)
  end
  redis.call('ZADD', KEYS[4], now_ms + life, owner)
  for i = 3, 4 do
    if redis.call('PTTL', KEYS[i]) < life + 1000 then
      redis.call('PEXPIRE', KEYS[i], life + 1000)
    end
  end
end
