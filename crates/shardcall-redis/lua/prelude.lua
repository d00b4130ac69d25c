-- Shared helpers, prepended to every script. Time is the server's (TIME), so
-- every member's lease runs on one clock.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function jget(key, field)
  local v = redis.call('HGET', key, field)
  if v then return cjson.decode(v) end
  return nil
end
local function jset(key, field, obj)
  redis.call('HSET', key, field, cjson.encode(obj))
end
local function fail(code, detail)
  return redis.error_reply(code .. ' ' .. (detail or ''))
end
local function live(rec, n)
  return rec and n < rec.x
end
-- A member record's set of held partitions ({} decodes as an empty table).
local function held_add(rec, p)
  if type(rec.p) ~= 'table' then rec.p = {} end
  rec.p[p] = 1
end
local function held_del(rec, p)
  if type(rec.p) == 'table' then rec.p[p] = nil end
end
-- The partitions a member record says are on their way to it (their target
-- is the member); member_view reads the entries and keeps the true ones.
local function incoming_add(rec, p)
  if type(rec) ~= 'table' then return end
  if type(rec.i) ~= 'table' then rec.i = {} end
  rec.i[p] = 1
end
local function incoming_del(rec, p)
  if type(rec) == 'table' and type(rec.i) == 'table' then rec.i[p] = nil end
end
local function holds(e, m, epoch)
  return e and (e.ph == 'owned' or e.ph == 'draining') and e.m == m and (epoch == nil or e.e == epoch)
end
local function quarantine(e, since)
  e.ph = 'quarantined'
  e.t = since
  e.b = false
end
-- Writes a checkpoint's fields after offset, state and epoch into the hash
-- `key`, from ARGV[from] on, as both checkpoint scripts take them: snapshot
-- history (JSON; empty: leave the stored one), source position, local
-- store size, a snapshot uploading ('1' or '0'), the done ranges above the
-- offset, the records in flight (each empty: none).
local function write_checkpoint_fields(key, from)
  if ARGV[from] ~= '' then redis.call('HSET', key, 'backup', ARGV[from]) end
  local fields = {'position', 'store_bytes', 'uploading', 'done', 'inflight'}
  for i, field in ipairs(fields) do
    local v = ARGV[from + i]
    if field == 'uploading' then
      if v == '1' then redis.call('HSET', key, field, '1') else redis.call('HDEL', key, field) end
    elseif v ~= '' then redis.call('HSET', key, field, v)
    else redis.call('HDEL', key, field) end
  end
end
