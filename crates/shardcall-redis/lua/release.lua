-- KEYS: members, table, version   ARGV: member, partition, epoch
local n = now_ms()
local m, p, epoch = ARGV[1], ARGV[2], tonumber(ARGV[3])
local rec = jget(KEYS[1], m)
if not live(rec, n) then return fail('LEASE', m) end
local e = jget(KEYS[2], p)
if not holds(e, m, epoch) then return fail('NOTHOLDER', m .. ' ' .. p .. ' ' .. ARGV[3]) end
quarantine(e, n)
jset(KEYS[2], p, e)
held_del(rec, p)
jset(KEYS[1], m, rec)
redis.call('INCR', KEYS[3])
return 1
