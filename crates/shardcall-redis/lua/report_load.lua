-- KEYS: members   ARGV: member, load report (JSON, kept as a string)
-- Replaces a live member's load report. Kept as a string so that Lua's
-- numbers (doubles) never round a figure.
local n = now_ms()
local rec = jget(KEYS[1], ARGV[1])
if not live(rec, n) then return fail('LEASE', ARGV[1]) end
rec.ld = ARGV[2]
jset(KEYS[1], ARGV[1], rec)
return 1
