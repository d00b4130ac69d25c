-- Partition slot. KEYS: failing. ARGV: epoch. Removes the report unless a
-- newer grant or claim made it.
local e = redis.call('HGET', KEYS[1], 'e')
if e and tonumber(e) <= tonumber(ARGV[1]) then redis.call('DEL', KEYS[1]) end
return 1
