-- Partition slot. KEYS: fence, checkpoint. ARGV: epoch, claim expiry,
-- offset, state, snapshot history (JSON; empty: leave the stored one),
-- source position (empty: none), local state store size (empty: none),
-- a snapshot uploading ('1' or '0'), the done ranges above the offset
-- (empty: none), the records in flight ('records,oldest_since_ms'; empty:
-- none). Written only while the claim runs on this server's clock and no
-- newer claim restored; offset and state together. The fields are those
-- owned mode's checkpoint writes: one checkpoint record for both modes.
if now_ms() >= tonumber(ARGV[2]) then return fail('LEASE', 'claim ' .. ARGV[1]) end
local fence = tonumber(redis.call('GET', KEYS[1]) or '0')
if fence ~= tonumber(ARGV[1]) then return fail('NOTHOLDER', 'claim ' .. ARGV[1]) end
redis.call('HSET', KEYS[2], 'offset', ARGV[3], 'state', ARGV[4], 'epoch', ARGV[1])
if ARGV[5] ~= '' then redis.call('HSET', KEYS[2], 'backup', ARGV[5]) end
if ARGV[6] ~= '' then redis.call('HSET', KEYS[2], 'position', ARGV[6])
else redis.call('HDEL', KEYS[2], 'position') end
if ARGV[7] ~= '' then redis.call('HSET', KEYS[2], 'store_bytes', ARGV[7])
else redis.call('HDEL', KEYS[2], 'store_bytes') end
if ARGV[8] == '1' then redis.call('HSET', KEYS[2], 'uploading', '1')
else redis.call('HDEL', KEYS[2], 'uploading') end
if ARGV[9] ~= '' then redis.call('HSET', KEYS[2], 'done', ARGV[9])
else redis.call('HDEL', KEYS[2], 'done') end
if ARGV[10] ~= '' then redis.call('HSET', KEYS[2], 'inflight', ARGV[10])
else redis.call('HDEL', KEYS[2], 'inflight') end
return 1
