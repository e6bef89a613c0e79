-- (Inlined where a script names it: the next fencing token, for a grant about to be made.)
-- Needs `t`, the server TIME, and KEYS[2], the fence counter of the name's Cluster slot; leaves
-- `now` (server time in microseconds, as text) and `fence` (decimal text), and returns the
-- error reply when KEYS[2] holds another type. It runs before any other write: a failure here
-- changes nothing but the counter, which may rise harmlessly.
--
-- The token must keep rising even when Redis lost the counter (restart without persistence,
-- failover before replication): server time in microseconds is a floor that only moves forward
-- as long as the server clock does. One command reads the stored fence and writes that floor;
-- only when the stored value is ahead (the clock stepped back, or two grants in one
-- microsecond) is it written again, as stored + 1.
--
-- Tokens stay decimal text from end to end: a Lua number is a double, exact only below 2^53, so
-- stored + 1 is computed on the digits (a carry through trailing nines), never by tonumber or
-- INCR (whose reply reaches Lua as a double). Without leading zeros a longer number is larger,
-- and at equal length text order is number order. A stored value that is not such a number
-- below 2^63 - 1 (written by someone else, or the ceiling reached) counts as lost, like after a
-- restart: the counter then holds the server time and tokens continue from there.
local now = t[1] .. string.sub('000000', #t[2] + 1) .. t[2]
local fence = now
do
  local stored = redis.pcall('SET', KEYS[2], now, 'GET')
  if type(stored) == 'table' and stored.err then
    if string.sub(stored.err, 1, 9) == 'WRONGTYPE' then
      return redis.error_reply('WRONGTYPE 2 the fencing counter holds another type')
    end
    return stored
  end
  if stored and (#stored > #now or (#stored == #now and stored >= now))
      and (#stored < 19 or (#stored == 19 and stored < '9223372036854775807'))
      and string.find(stored, '^[1-9][0-9]*$') then
    local i = #stored
    while i > 0 and string.byte(stored, i) == 57 do
      i = i - 1
    end
    if i == 0 then
      fence = '1' .. string.rep('0', #stored)
    else
      fence = string.sub(stored, 1, i - 1) .. string.char(string.byte(stored, i) + 1)
        .. string.rep('0', #stored - i)
    end
    redis.call('SET', KEYS[2], fence)
  end
end
