-- Ticket pool helpers. Group slot keys: KEYS[1] queue (zset: score = due ms
-- * 1024 + arrival mod 1024, so due time first, then arrival order),
-- KEYS[2] claims (hash: partition -> {h=holder, e=epoch, x=expiry}),
-- KEYS[3] leases (zset: partition -> expiry), KEYS[4] epochs (hash),
-- KEYS[5] arrivals (counter), KEYS[6] the channel rung when a ticket is due.
-- "A ticket is due" for waiting claimers: a hint, so a refused publish (an
-- ACL user without the channel) must not fail the script after its writes.
local function hint()
  redis.pcall('PUBLISH', KEYS[6], 1)
end
local function place(due)
  local n = redis.call('INCR', KEYS[5]) % 1024
  return due * 1024 + n
end
local function enqueue(p, due)
  redis.call('ZADD', KEYS[1], place(due), p)
end
local function expire(now)
  local lapsed = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
  for _, p in ipairs(lapsed) do
    redis.call('ZREM', KEYS[3], p)
    redis.call('HDEL', KEYS[2], p)
    enqueue(p, now)
  end
  return #lapsed
end
-- The claim if ARGV holder/epoch is current and runs, else a refusal.
local function current(p, holder, epoch, now)
  local c = jget(KEYS[2], p)
  if not c or c.h ~= holder or c.e ~= epoch then
    return nil, fail('NOTHOLDER', holder .. ' ' .. epoch)
  end
  if c.x <= now then return nil, fail('LEASE', holder) end
  return c, nil
end
