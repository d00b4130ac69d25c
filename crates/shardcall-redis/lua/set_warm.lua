-- KEYS: members   ARGV: member, partitions (JSON array of table fields)
-- Replaces a live member's set of warm partitions.
local n = now_ms()
local rec = jget(KEYS[1], ARGV[1])
if not live(rec, n) then return fail('LEASE', ARGV[1]) end
local wm = {}
for _, p in ipairs(cjson.decode(ARGV[2])) do wm[p] = 1 end
rec.wm = wm
jset(KEYS[1], ARGV[1], rec)
return 1
