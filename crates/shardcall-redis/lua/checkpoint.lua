-- Partition slot. KEYS: grant, checkpoint   ARGV: member, epoch, offset, state
-- Written only by the holder under its epoch; offset and state together.
local g = redis.call('HMGET', KEYS[1], 'm', 'e', 'h')
if g[1] ~= ARGV[1] or g[2] ~= ARGV[2] or g[3] ~= '1' then
  return fail('NOTHOLDER', ARGV[1] .. ' ' .. ARGV[2])
end
redis.call('HSET', KEYS[2], 'offset', ARGV[3], 'state', ARGV[4], 'epoch', ARGV[2])
return 1
