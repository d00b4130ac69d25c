-- Partition slot. KEYS: grant, checkpoint
-- ARGV: member, epoch, offset, state, lease end (server ms, as the last renewal reported it),
--       snapshot history (JSON; empty: leave the stored one), source position (empty: none),
--       local state store size (empty: none), a snapshot uploading ('1' or '0'),
--       the done ranges above the offset (empty: none), the records in flight
--       ('records,oldest_since_ms'; empty: none)
-- Written only by the holder under its epoch, and only while its lease runs
-- on this server's clock (the lease itself lives in another slot, so the
-- member hands in the end the server last gave it); offset and state together.
if now_ms() >= tonumber(ARGV[5]) then return fail('LEASE', ARGV[1]) end
local g = redis.call('HMGET', KEYS[1], 'm', 'e', 'h')
if g[1] ~= ARGV[1] or g[2] ~= ARGV[2] or g[3] ~= '1' then
  return fail('NOTHOLDER', ARGV[1] .. ' ' .. ARGV[2])
end
redis.call('HSET', KEYS[2], 'offset', ARGV[3], 'state', ARGV[4], 'epoch', ARGV[2])
write_checkpoint_fields(KEYS[2], 6)
return 1
