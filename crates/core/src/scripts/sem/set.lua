-- Set, try to set, or change a semaphore's number of permits, or delete the semaphore.
--
-- KEYS[1..6]  as in sem/common.lua
-- ARGV[1]     'try' (set only if never set), 'set', 'add' (ARGV[2] may be negative), 'delete'
-- ARGV[2]     the number
-- ARGV[3]     waiter channel prefix  P:{N}:released:
--
-- Replies: 1 changed, 0 not ('try' on a semaphore already set, 'delete' of nothing). Waiters
-- at the head whose permits are now there are granted them (sem/common.lua's hand_on). Lowering the number below what is taken is allowed:
-- new acquisitions wait until enough permits come back. Errors: 'RANGE ...' when 'add' would
-- take the number below 0 or above 2^32 - 1 (nothing changed); 'WRONGTYPE <i> ...';
-- 'WRONGKIND <kind> semaphore' when the name is in use by another kind.
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local prefix = ARGV[3]
@SEM_COMMON@

local refused = wrong_type()
if refused then
  return refused
end
local op, n = ARGV[1], tonumber(ARGV[2])
if op == 'delete' then
  -- Every waiter is told (it finds no permits and waits for a new number, or gives up);
  -- holders learn at their next renewal that their permits are gone.
  local line = redis.call('ZRANGE', KEYS[3], 0, -1)
  for _, who in ipairs(line) do
    redis.call('@PUBLISH@', prefix .. who, '@FREE@')
  end
  return redis.call('DEL', KEYS[1], KEYS[5]) > 0 and 1 or 0
end
prune()
-- Numbers of permits are whole numbers from 0 to 2^32 - 1 (the client refuses others before
-- sending), so a Lua double holds them, and every sum below, exactly.
if op == 'try' then
  if redis.call('HEXISTS', KEYS[1], '@PERMITS@') == 1 then
    return 0
  end
elseif op == 'add' then
  local total = tonumber(redis.call('HGET', KEYS[1], '@PERMITS@') or '0') + n
  if total < 0 or total > 4294967295 then
    return redis.error_reply('RANGE ' .. ARGV[2] .. ' permits added to the semaphore\'s '
      .. (total - n) .. ' would make ' .. total .. ': a semaphore has 0 to 4294967295 permits')
  end
  n = total
end
redis.call('HSET', KEYS[1], '@PERMITS@', n, '@KIND@', 'semaphore')
hand_on(false)
return 1
