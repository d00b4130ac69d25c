-- ARGV: partitions...  Adds a ticket, due now, for each partition neither
-- queued nor claimed. Returns how many were added.
local now = now_ms()
local added = 0
for _, p in ipairs(ARGV) do
  if not redis.call('ZSCORE', KEYS[1], p) and redis.call('HEXISTS', KEYS[2], p) == 0 then
    enqueue(p, now)
    added = added + 1
  end
end
if added > 0 then hint() end
return added
