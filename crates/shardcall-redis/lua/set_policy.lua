-- KEYS: policy, audit, version   ARGV: policy (JSON), actor, description
-- An operator's change of the group's quarantine rule, audited with the
-- rule before (as the caller read it, in ARGV[4]) and after; the version
-- moves so coordinators read it at their next tick.
local n = now_ms()
local p = cjson.decode(ARGV[1])
p.set_by = ARGV[2]
p.set_at = n
local j = cjson.encode(p)
redis.call('SET', KEYS[1], j)
redis.call('RPUSH', KEYS[2], cjson.encode({at = n, actor = ARGV[2], action = 'changed the quarantine policy from ' .. ARGV[4] .. ' to ' .. ARGV[3]}))
redis.call('INCR', KEYS[3])
return j
