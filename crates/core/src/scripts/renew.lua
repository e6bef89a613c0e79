-- Renew many holds in one round trip (the watchdog's tick).
--
-- KEYS[1..n]   lock hashes (on Cluster, all in one slot: the caller groups by slot)
-- ARGV[1]      lease in milliseconds
-- ARGV[2..n+1] owner id of the hold at the same position in KEYS
--
-- Replies: an array of n integers: 1 renewed; 0 the owner no longer holds that lock (expired,
-- force-unlocked, taken by another owner after expiry, or the key now holds another type).
local renewed = {}
for i = 1, #KEYS do
  local held = redis.pcall('HEXISTS', KEYS[i], ARGV[i + 1])
  if held == 1 then
    redis.call('PEXPIRE', KEYS[i], ARGV[1])
    renewed[i] = 1
  else
    renewed[i] = 0
  end
end
return renewed
