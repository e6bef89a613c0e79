-- (Inlined by the semaphore's and the read/write lock's common pieces, whose helpers are
-- functions.) What every grant the line makes writes and says, besides the kind's own fields:
-- a new fencing token, the waiter's lease, and one message on the waiter's channel. (The
-- lock's line/hand_on.lua does the same inline: its scripts are the hot path, and a Lua
-- function is a closure created on every call.)
--
-- Needs `t` (server TIME), `now_ms`, `prefix` (the waiter channel prefix P:{N}:released:),
-- KEYS[2] (the fence counter), KEYS[4] (the entries' deadlines) and `gone` (the keys the
-- script emptied, by index).

-- The next fencing token. (The fence piece's error reply for a counter of another type cannot
-- come here: the kinds' wrong_type() refused that before anything was written.)
local function next_fence()
  @NEXT_FENCE@
  return fence
end

-- The lease a waiter is granted: the fixed one it asked for (`fixed`, ms), or until its entry
-- would have lapsed, so that a waiter that died meanwhile holds the grant no longer than its
-- entry would have held its place.
local function grant_lease(who, fixed)
  if fixed then
    return fixed
  end
  local until_ms = not gone[4] and redis.call('ZSCORE', KEYS[4], who)
  return math.max(tonumber(until_ms or now_ms) - now_ms, 1)
end

-- Tells the waiter `who`, on its own channel, of its grant: '@GRANT@<token>:<lease ms>:<field>',
-- `field` naming what its hold is counted in.
local function tell_granted(who, fence, lease, field)
  redis.call('@PUBLISH@', prefix .. who, '@GRANT@' .. fence .. ':' .. lease .. ':' .. field)
end
