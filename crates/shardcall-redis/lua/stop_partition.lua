-- Group slot. KEYS: table, members, stopped, audit
-- ARGV: partition, member, epoch, reason
-- Stops a partition for the group: only its holder (owned or draining,
-- under that epoch, with a live lease) may; the audit log says so.
local n = now_ms()
local rec = jget(KEYS[2], ARGV[2])
if not live(rec, n) then return fail('LEASE', ARGV[2]) end
local e = jget(KEYS[1], ARGV[1])
if not holds(e, ARGV[2], tonumber(ARGV[3])) then
  return fail('NOTHOLDER', ARGV[2] .. ' ' .. ARGV[3])
end
jset(KEYS[3], ARGV[1], {m = ARGV[2], e = tonumber(ARGV[3]), since = n, reason = ARGV[4]})
redis.call('RPUSH', KEYS[4], cjson.encode({at = n, actor = ARGV[2], action = 'stopped ' .. ARGV[1] .. ': ' .. ARGV[4]}))
return 1
