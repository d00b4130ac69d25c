-- KEYS: lock   ARGV: member, epoch
if redis.call('HGET', KEYS[1], 'holder') == ARGV[1]
  and redis.call('HGET', KEYS[1], 'epoch') == ARGV[2] then
  redis.call('DEL', KEYS[1])
end
return 0
