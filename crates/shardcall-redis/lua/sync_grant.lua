-- Partition slot. KEYS: grant   ARGV: member, epoch, held (0/1), coordinator epoch
-- Refuses a coordinator older than the last one that wrote this record.
local c = tonumber(redis.call('HGET', KEYS[1], 'c') or '0')
if c > tonumber(ARGV[4]) then return fail('STALECOORD', ARGV[4]) end
redis.call('HSET', KEYS[1], 'm', ARGV[1], 'e', ARGV[2], 'h', ARGV[3], 'c', ARGV[4])
return 1
