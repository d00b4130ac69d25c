-- Partition slot. KEYS: fence, checkpoint. ARGV: epoch, claim expiry,
-- offset, state, the done ranges above the offset (empty: none). Written only while the claim runs on this server's clock
-- and no newer claim restored; offset and state together.
if now_ms() >= tonumber(ARGV[2]) then return fail('LEASE', 'claim ' .. ARGV[1]) end
local fence = tonumber(redis.call('GET', KEYS[1]) or '0')
if fence ~= tonumber(ARGV[1]) then return fail('NOTHOLDER', 'claim ' .. ARGV[1]) end
redis.call('HSET', KEYS[2], 'offset', ARGV[3], 'state', ARGV[4], 'epoch', ARGV[1])
if ARGV[5] ~= '' then redis.call('HSET', KEYS[2], 'done', ARGV[5])
else redis.call('HDEL', KEYS[2], 'done') end
return 1
