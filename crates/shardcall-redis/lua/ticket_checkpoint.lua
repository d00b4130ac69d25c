-- Partition slot. KEYS: fence, checkpoint. ARGV: epoch, claim expiry,
-- offset, state, snapshot history (JSON; empty: leave the stored one),
-- source position (empty: none), local state store size (empty: none),
-- a snapshot uploading ('1' or '0'), the done ranges above the offset
-- (empty: none), the records in flight ('records,oldest_since_ms'; empty:
-- none). Written only while the claim runs on this server's clock and no
-- newer claim restored; offset and state together. The fields are those
-- owned mode's checkpoint writes (write_checkpoint_fields, in the prelude):
-- one checkpoint record for both modes.
if now_ms() >= tonumber(ARGV[2]) then return fail('LEASE', 'claim ' .. ARGV[1]) end
local fence = tonumber(redis.call('GET', KEYS[1]) or '0')
if fence ~= tonumber(ARGV[1]) then return fail('NOTHOLDER', 'claim ' .. ARGV[1]) end
redis.call('HSET', KEYS[2], 'offset', ARGV[3], 'state', ARGV[4], 'epoch', ARGV[1])
write_checkpoint_fields(KEYS[2], 5)
return 1
