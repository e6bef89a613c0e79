-- Undo an acquire whose reply never arrived (timed out, connection lost, future dropped).
--
-- The client cannot know whether Redis ran the acquire, so it asks: "if this owner's hold count
-- is exactly what that acquire would have produced, take that one hold back". A count that
-- differs means the acquire never ran (or the hold already changed hands), and nothing changes.
--
-- KEYS[1]  lock hash  P:{N}
-- ARGV[1]  owner id
-- ARGV[2]  the hold count the unanswered acquire would have produced
-- ARGV[3]  release channel  P:{N}:released
--
-- Replies: 1 one hold taken back, 0 nothing to undo. Taking back the last hold frees the lock
-- and publishes '*' (one waiter per client wakes).
if redis.call('TYPE', KEYS[1])['ok'] ~= 'hash' then
  return 0
end
local count = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
if count ~= tonumber(ARGV[2]) then
  return 0
end
if count > 1 then
  redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
  return 1
end
redis.call('PUBLISH', ARGV[3], '*')
redis.call('DEL', KEYS[1])
return 1
