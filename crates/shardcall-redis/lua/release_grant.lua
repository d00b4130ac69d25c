-- Partition slot. KEYS: grant   ARGV: member, epoch
-- The holder gives the partition up: its checkpoints are refused from now on.
local g = redis.call('HMGET', KEYS[1], 'm', 'e', 'h')
if g[1] ~= ARGV[1] or g[2] ~= ARGV[2] then return fail('NOTHOLDER', ARGV[1] .. ' ' .. ARGV[2]) end
redis.call('HSET', KEYS[1], 'h', '0')
return 1
