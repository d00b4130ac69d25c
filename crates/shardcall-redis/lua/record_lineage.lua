-- Group slot. KEYS: lock, lineage   ARGV: member, coordinator epoch, standings (JSON)
-- Records the lineage the coordinator found; only the holder of the
-- coordinator lock under that epoch, before it lapses, may.
local n = now_ms()
if redis.call('HGET', KEYS[1], 'holder') ~= ARGV[1]
  or redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[2]
  or n >= tonumber(redis.call('HGET', KEYS[1], 'x') or '0') then
  return fail('STALECOORD', ARGV[2])
end
redis.call('SET', KEYS[2], '{"by":' .. cjson.encode(ARGV[1]) .. ',"e":' .. ARGV[2]
  .. ',"at":' .. n .. ',"s":' .. ARGV[3] .. '}')
return 1
