-- Partition slot. KEYS: restoring (hash: m, w, ph, f, t, since).
-- ARGV: member, warm_up (0|1), phase, fetched bytes, total bytes, ttl ms.
-- The report replaces the last one and expires unless renewed; its start
-- is kept while the same member reports.
local since = redis.call('HGET', KEYS[1], 'since')
if since == false or redis.call('HGET', KEYS[1], 'm') ~= ARGV[1] then since = now_ms() end
redis.call('HSET', KEYS[1], 'm', ARGV[1], 'w', ARGV[2], 'ph', ARGV[3], 'f', ARGV[4], 't', ARGV[5], 'since', since)
redis.call('PEXPIRE', KEYS[1], ARGV[6])
return 1
