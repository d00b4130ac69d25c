-- Partition slot. KEYS: failing (hash: m, e, n, since, err).
-- ARGV: member, epoch, attempts, error. The report replaces the last one;
-- the streak's start is kept unless this is its first attempt.
local since = redis.call('HGET', KEYS[1], 'since')
if since == false or tonumber(ARGV[3]) <= 1 then since = now_ms() end
redis.call('HSET', KEYS[1], 'm', ARGV[1], 'e', ARGV[2], 'n', ARGV[3], 'since', since, 'err', ARGV[4])
return 1
