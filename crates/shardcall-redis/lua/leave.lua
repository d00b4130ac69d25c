-- KEYS: members, table, lock, version   ARGV: member
-- Returns {p1, epoch1, ...}: partitions quarantined (their grant records must follow).
local n = now_ms()
local m = ARGV[1]
local rec = jget(KEYS[1], m)
if not rec then return {} end
local out = {}
if type(rec.p) == 'table' then
  for p, _ in pairs(rec.p) do
    local e = jget(KEYS[2], p)
    if holds(e, m) then
      quarantine(e, n)
      jset(KEYS[2], p, e)
      table.insert(out, p)
      table.insert(out, e.e)
    end
  end
end
redis.call('HDEL', KEYS[1], m)
if redis.call('HGET', KEYS[3], 'holder') == m then redis.call('DEL', KEYS[3]) end
redis.call('INCR', KEYS[4])
return out
