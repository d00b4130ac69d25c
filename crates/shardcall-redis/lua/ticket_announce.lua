-- KEYS[1]: the group's ticket workers (hash: member id -> JSON record).
-- ARGV: member id, record (JSON), ttl ms. Records the worker until now +
-- ttl on the server's clock and forgets those whose announcement lapsed.
local now = now_ms()
local rec = cjson.decode(ARGV[2])
rec.expires = now + tonumber(ARGV[3])
jset(KEYS[1], ARGV[1], rec)
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local ok, other = pcall(cjson.decode, all[i + 1])
  if ok and type(other) == 'table' and tonumber(other.expires) and other.expires <= now then
    redis.call('HDEL', KEYS[1], all[i])
  end
end
return 1
