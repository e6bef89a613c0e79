-- (Inlined where a release script names it, in its settle path.) A settle that takes back the
-- grant of a waiter's try whose reply never came puts that waiter back where it stood in line:
-- the waiter is still waiting (its leave, should it give up, runs after this settle and takes
-- the entry out), and a settle must not cost a live waiter its place. The hand-on that follows
-- then finds it first again.
--
-- Needs `owner`, `place` (its score in the line, as the busy reply that queued it said; nil for
-- a try that had no place), `place_life` (its entry's lifetime in ms), `now_ms`, KEYS[3] (the
-- line) and KEYS[4] (the entries' deadlines).
if place then
  redis.call('ZADD', KEYS[3], place, owner)
  redis.call('ZADD', KEYS[4], now_ms + place_life, owner)
  for i = 3, 4 do
    if redis.call('PTTL', KEYS[i]) < place_life + 1000 then
      redis.call('PEXPIRE', KEYS[i], place_life + 1000)
    end
  end
end
