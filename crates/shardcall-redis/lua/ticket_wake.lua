-- ARGV: partition. A queued ticket not due yet becomes due now.
local now = now_ms()
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or math.floor(tonumber(score) / 1024) <= now then return 0 end
enqueue(ARGV[1], now)
hint()
return 1
