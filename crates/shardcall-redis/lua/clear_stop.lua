-- Group slot. KEYS: stopped, audit   ARGV: partition, actor
-- An operator clears a partition's stop; 1 if it was stopped.
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('RPUSH', KEYS[2], cjson.encode({at = now_ms(), actor = ARGV[2], action = 'cleared the stop of ' .. ARGV[1]}))
return 1
