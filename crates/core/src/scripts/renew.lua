-- Renew many holds in one round trip (the watchdog's tick).
--
-- KEYS[1..n]  lock hashes (on Cluster, all in one slot: the caller groups by slot)
-- ARGV[1]     lease in milliseconds
-- ARGV[2i]    owner id of the hold at position i in KEYS
-- ARGV[2i+1]  the token of the grant that hold belongs to
--
-- Replies: an array of n integers: 1 renewed; 0 that grant is gone (expired, force-unlocked,
-- taken by another owner, replaced by a later grant of the same owner, or the key now holds
-- another type). A renewal extends only the grant it was made for: the same owner's later
-- grant has another token, and a guard whose grant ended must stay lost.
--
-- A renewal only ever extends: the same owner may have re-entered with a longer explicit lease
-- (lock_with_lease), and that hold's guard counts on its full lease (as acquire.lua does).
local lease = tonumber(ARGV[1])
local renewed = {}
for i = 1, #KEYS do
  local fields = redis.pcall('HMGET', KEYS[i], ARGV[2 * i], '@FENCE@')
  if not fields.err and fields[1] and fields[2] == ARGV[2 * i + 1] then
    if redis.call('PTTL', KEYS[i]) < lease then
      redis.call('PEXPIRE', KEYS[i], ARGV[1])
    end
    renewed[i] = 1
  else
    renewed[i] = 0
  end
end
return renewed
