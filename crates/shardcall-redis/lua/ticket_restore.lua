-- Partition slot. KEYS: fence, checkpoint. ARGV: epoch, claim expiry.
-- Raises the partition's fence to the claim's epoch (older claims can no
-- longer write) and returns the checkpoint's fields as owned mode reads
-- them ({offset, state, epoch, backup, position, store_bytes, uploading,
-- done, inflight}; all nil: none yet).
if now_ms() >= tonumber(ARGV[2]) then return fail('LEASE', 'claim ' .. ARGV[1]) end
local e = tonumber(ARGV[1])
local fence = tonumber(redis.call('GET', KEYS[1]) or '0')
if fence > e then return fail('NOTHOLDER', 'claim ' .. ARGV[1]) end
redis.call('SET', KEYS[1], e)
return redis.call('HMGET', KEYS[2], 'offset', 'state', 'epoch', 'backup', 'position',
  'store_bytes', 'uploading', 'done', 'inflight')
