-- KEYS: table, version   ARGV: member, partition, epoch
local e = jget(KEYS[1], ARGV[2])
if not (e and e.ph == 'quarantined' and e.m == ARGV[1] and e.e == tonumber(ARGV[3])) then
  return fail('NOTHOLDER', ARGV[1] .. ' ' .. ARGV[2] .. ' ' .. ARGV[3])
end
e.b = true
jset(KEYS[1], ARGV[2], e)
redis.call('INCR', KEYS[2])
return 1
