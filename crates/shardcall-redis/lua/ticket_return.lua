-- ARGV: partition, holder, epoch, ready in ms. The ticket goes to the back
-- of the queue, due after the delay; waiting claimers hear of a due one.
local now = now_ms()
local _, err = current(ARGV[1], ARGV[2], tonumber(ARGV[3]), now)
if err then return err end
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
local delay = tonumber(ARGV[4])
enqueue(ARGV[1], now + delay)
if delay == 0 then hint() end
return 1
