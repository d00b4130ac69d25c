-- KEYS: members, version   ARGV: member, weight, host, ttl_ms
local n = now_ms()
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return fail('EXISTS', ARGV[1]) end
local x = n + tonumber(ARGV[4])
jset(KEYS[1], ARGV[1], {w = tonumber(ARGV[2]), h = ARGV[3], j = n, hb = n, x = x, p = {}})
redis.call('INCR', KEYS[2])
return x
