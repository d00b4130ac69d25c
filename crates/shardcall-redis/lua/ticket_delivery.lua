-- Partition slot. KEYS: fence, deliveries (hash: o = first offset, n = count).
-- ARGV: epoch, claim expiry, first offset. One more delivery of the batch
-- starting at the offset, under a current claim; the count starts again at
-- another offset. Returns the count.
if now_ms() >= tonumber(ARGV[2]) then return fail('LEASE', 'claim ' .. ARGV[1]) end
local fence = tonumber(redis.call('GET', KEYS[1]) or '0')
if fence ~= tonumber(ARGV[1]) then return fail('NOTHOLDER', 'claim ' .. ARGV[1]) end
if redis.call('HGET', KEYS[2], 'o') ~= ARGV[3] then
  redis.call('HSET', KEYS[2], 'o', ARGV[3], 'n', 0)
end
return redis.call('HINCRBY', KEYS[2], 'n', 1)
