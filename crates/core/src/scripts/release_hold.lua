-- (Inlined where a lock's release script names it: the checks and the count before the last
-- hold goes.) Needs KEYS[1] (the lock hash), ARGV[1] (the owner), ARGV[3] (the grant's token,
-- absent or '' for "the owner's grant"), ARGV[4] (absent or '' for a release; the expected
-- count when settling) and ARGV[8] ('a' when settling an acquire). Returns -1 when the owner
-- holds nothing here under that token, -2 when settling finds nothing to undo, the remaining
-- count after releasing a re-entered hold; falls through when the owner's last hold is to go.
--
-- The grant is checked only when the client asks: it sends the token when this hold's grant
-- may have been replaced by a later grant of the same owner, and for settles (the common
-- release skips the second read). Counts are written by HSET '1' and HINCRBY, so they are
-- canonical decimal text.
do
  local count = redis.pcall('HGET', KEYS[1], ARGV[1])
  if type(count) == 'table' then
    if string.sub(count.err, 1, 9) == 'WRONGTYPE' then
      return redis.error_reply('WRONGTYPE 1 the lock key holds another type')
    end
    return count
  end
  if not count then
    return -1
  end
  if ARGV[3] and ARGV[3] ~= '' and redis.call('HGET', KEYS[1], '@FENCE@') ~= ARGV[3] then
    return -1
  end
  if ARGV[4] and ARGV[4] ~= '' then
    if count ~= ARGV[4] then
      return -2
    end
    -- Settling a fresh acquire (ARGV[8] 'a', no token: not a re-entry, whose grant the client
    -- holds, maybe taken from its message with the mark still on): a grant the line made (a
    -- release handed the lock to this waiter while its try was unanswered) is not the try's
    -- doing, whose own grants are never marked. It stays: the waiter takes it, or hands it on
    -- when it leaves.
    if ARGV[8] == 'a' and (ARGV[3] or '') == ''
        and redis.call('HEXISTS', KEYS[1], '@GRANTED@') == 1 then
      return -2
    end
  end
  if count ~= '1' then
    return redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
  end
end
