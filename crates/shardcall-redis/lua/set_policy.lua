-- KEYS: policy, audit, version
-- ARGV: policy (JSON), actor, description, the rule before (for the audit),
--       only if unset (0/1)
-- Sets the group's quarantine rule, with who and when, audited; the version
-- moves so coordinators read it at their next tick. With "only if unset"
-- (the first member of a group) an existing rule is returned unchanged.
local cur = redis.call('GET', KEYS[1])
if cur and ARGV[5] == '1' then return cur end
local n = now_ms()
local p = cjson.decode(ARGV[1])
p.set_by = ARGV[2]
p.set_at = n
local j = cjson.encode(p)
redis.call('SET', KEYS[1], j)
local action = 'created the quarantine policy: ' .. ARGV[3]
if cur then action = 'changed the quarantine policy from ' .. ARGV[4] .. ' to ' .. ARGV[3] end
redis.call('RPUSH', KEYS[2], cjson.encode({at = n, actor = ARGV[2], action = action}))
redis.call('INCR', KEYS[3])
return j
