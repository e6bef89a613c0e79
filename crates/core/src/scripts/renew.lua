-- Renew many holds in one round trip (the watchdog's tick).
--
-- KEYS[1..n]   lock hashes (on Cluster, all in one slot: the caller groups by slot)
-- ARGV[1]      lease in milliseconds
-- ARGV[2..n+1] owner id of the hold at the same position in KEYS
--
-- Replies: an array of n integers: 1 renewed; 0 the owner no longer holds that lock (expired,
-- force-unlocked, taken by another owner after expiry, or the key now holds another type).
--
-- A renewal only ever extends: the same owner may have re-entered with a longer explicit lease
-- (lock_with_lease), and that hold's guard counts on its full lease (as acquire.lua does).
local lease = tonumber(ARGV[1])
local renewed = {}
for i = 1, #KEYS do
  local held = redis.pcall('HEXISTS', KEYS[i], ARGV[i + 1])
  if held == 1 then
    if redis.call('PTTL', KEYS[i]) < lease then
      redis.call('PEXPIRE', KEYS[i], ARGV[1])
    end
    renewed[i] = 1
  else
    renewed[i] = 0
  end
end
return renewed
