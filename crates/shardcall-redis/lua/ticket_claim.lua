-- ARGV: holder, ttl ms. Lapsed claims go back first; then the front ticket,
-- if due, is claimed under the partition's next epoch.
-- Returns {1, partition, epoch, expiry} or {0, next due ms or -1, now}.
local now = now_ms()
if expire(now) > 0 then hint() end
local front = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #front == 0 then return {0, -1, now} end
local due = math.floor(tonumber(front[2]) / 1024)
if due > now then return {0, due, now} end
local p = front[1]
redis.call('ZREM', KEYS[1], p)
local epoch = redis.call('HINCRBY', KEYS[4], p, 1)
local x = now + tonumber(ARGV[2])
jset(KEYS[2], p, {h = ARGV[1], e = epoch, x = x})
redis.call('ZADD', KEYS[3], x, p)
return {1, p, epoch, x}
