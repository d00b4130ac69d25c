-- KEYS: members, version, audit   ARGV: member, actor
local n = now_ms()
local rec = jget(KEYS[1], ARGV[1])
if not rec then return fail('LEASE', ARGV[1]) end
rec.d = true
jset(KEYS[1], ARGV[1], rec)
redis.call('INCR', KEYS[2])
redis.call('RPUSH', KEYS[3], cjson.encode({at = n, actor = ARGV[2], action = 'drained member ' .. ARGV[1]}))
return 1
