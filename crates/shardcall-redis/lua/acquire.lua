-- KEYS: members, lock, lockseq   ARGV: member, ttl_ms
local n = now_ms()
if not live(jget(KEYS[1], ARGV[1]), n) then return fail('LEASE', ARGV[1]) end
local holder = redis.call('HGET', KEYS[2], 'holder')
local x = tonumber(redis.call('HGET', KEYS[2], 'x') or '0')
local ttl = tonumber(ARGV[2])
if holder == ARGV[1] and n < x then
  redis.call('HSET', KEYS[2], 'x', n + ttl)
  return {tonumber(redis.call('HGET', KEYS[2], 'epoch')), n + ttl}
end
-- A lock whose holder's member lease lapsed is as good as free.
if holder and n < x and live(jget(KEYS[1], holder), n) then return {} end
local epoch = redis.call('INCR', KEYS[3])
redis.call('HSET', KEYS[2], 'holder', ARGV[1], 'epoch', epoch, 'x', n + ttl)
return {epoch, n + ttl}
