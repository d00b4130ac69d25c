-- Partition slot. KEYS: grant, checkpoint   ARGV: offset, force (0/1), clear state (0/1)
-- Moves the offset (the state stays unless cleared); the epoch becomes 0 and
-- the snapshot history and the done ranges go, so no local state store takes
-- the operator's position for its own and no record above it is skipped. Refused while held unless forced.
if ARGV[2] ~= '1' and redis.call('HGET', KEYS[1], 'h') == '1' then
  return fail('WRONGPHASE', 'held (drain its owner first, or force)')
end
local prev = redis.call('HGET', KEYS[2], 'offset')
if prev then
  redis.call('HSET', KEYS[2], 'offset', ARGV[1], 'epoch', '0')
  redis.call('HDEL', KEYS[2], 'backup', 'position', 'store_bytes', 'uploading', 'done', 'inflight')
  if ARGV[3] == '1' then redis.call('HSET', KEYS[2], 'state', '') end
else
  redis.call('HSET', KEYS[2], 'offset', ARGV[1], 'state', '', 'epoch', '0')
end
return prev or -1
