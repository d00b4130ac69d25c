-- KEYS: policy, audit, version   ARGV: policy (JSON), actor, description
-- The group's quarantine rule, created by the first member to ask (who and
-- when kept with it, audited); an existing rule is returned unchanged.
local cur = redis.call('GET', KEYS[1])
if cur then return cur end
local n = now_ms()
local p = cjson.decode(ARGV[1])
p.set_by = ARGV[2]
p.set_at = n
local j = cjson.encode(p)
redis.call('SET', KEYS[1], j)
redis.call('RPUSH', KEYS[2], cjson.encode({at = n, actor = ARGV[2], action = 'created the quarantine policy: ' .. ARGV[3]}))
redis.call('INCR', KEYS[3])
return j
