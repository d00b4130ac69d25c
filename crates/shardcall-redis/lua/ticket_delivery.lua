-- Partition slot. KEYS: fence, deliveries (hash: "FIRST-LAST" -> count).
-- ARGV: epoch, claim expiry, first offset, last offset. One more delivery
-- of the batch FIRST..=LAST under a current claim. Each batch keeps its own
-- count (a batch and the records of it delivered one by one count apart);
-- counts of batches that end before this one starts are forgotten (they
-- were processed or dead-lettered), as is anything else in the hash.
-- Returns the count.
if now_ms() >= tonumber(ARGV[2]) then return fail('LEASE', 'claim ' .. ARGV[1]) end
local fence = tonumber(redis.call('GET', KEYS[1]) or '0')
if fence ~= tonumber(ARGV[1]) then return fail('NOTHOLDER', 'claim ' .. ARGV[1]) end
local first = tonumber(ARGV[3])
local fields = redis.call('HKEYS', KEYS[2])
for _, f in ipairs(fields) do
  local _, last = string.match(f, '^(%d+)-(%d+)$')
  if not last or tonumber(last) < first then
    redis.call('HDEL', KEYS[2], f)
  end
end
return redis.call('HINCRBY', KEYS[2], ARGV[3] .. '-' .. ARGV[4], 1)
