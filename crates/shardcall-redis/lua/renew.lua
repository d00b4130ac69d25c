-- KEYS: members   ARGV: member, ttl_ms
local n = now_ms()
local rec = jget(KEYS[1], ARGV[1])
if not live(rec, n) then return fail('LEASE', ARGV[1]) end
rec.hb = n
rec.x = n + tonumber(ARGV[2])
jset(KEYS[1], ARGV[1], rec)
return rec.x
