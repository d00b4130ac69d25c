-- Partition slot. KEYS: restoring. ARGV: member. Removes the report if
-- this member made it.
if redis.call('HGET', KEYS[1], 'm') == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
