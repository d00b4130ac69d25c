-- ARGV: partition, holder, epoch, ttl ms. Returns the new expiry.
local now = now_ms()
local c, err = current(ARGV[1], ARGV[2], tonumber(ARGV[3]), now)
if err then return err end
c.x = now + tonumber(ARGV[4])
jset(KEYS[2], ARGV[1], c)
redis.call('ZADD', KEYS[3], c.x, ARGV[1])
return c.x
