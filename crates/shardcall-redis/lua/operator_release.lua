-- KEYS: table, version, audit   ARGV: partition, actor
local n = now_ms()
local e = jget(KEYS[1], ARGV[1])
if not (e and e.ph == 'quarantined') then
  return fail('WRONGPHASE', ARGV[1] .. ' ' .. (e and e.ph or 'unknown'))
end
e.ph = 'free'
jset(KEYS[1], ARGV[1], e)
redis.call('INCR', KEYS[2])
redis.call('RPUSH', KEYS[3], cjson.encode({at = n, actor = ARGV[2], action = 'released ' .. ARGV[1] .. ' from quarantine'}))
return 1
