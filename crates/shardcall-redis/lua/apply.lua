-- KEYS: members, table, lock, version, policy
-- ARGV: coordinator epoch, expected version, commands (JSON array)
-- All or nothing: entries are changed in memory and written only when every
-- command passed. Returns {new version, p1, member1, epoch1, held1, ...}: the
-- grant records to bring in line (one per partition whose holder changed).
local n = now_ms()
local coord = tonumber(ARGV[1])
if redis.call('HGET', KEYS[3], 'epoch') ~= ARGV[1]
  or n >= tonumber(redis.call('HGET', KEYS[3], 'x') or '0') then
  return fail('STALECOORD', ARGV[1])
end
local version = tonumber(redis.call('GET', KEYS[4]) or '0')
if version ~= tonumber(ARGV[2]) then return fail('CONFLICT', tostring(version)) end
local pol = cjson.decode(redis.call('GET', KEYS[5]) or '{"min_ms":0,"wait_for_backup":false,"max_ms":0,"release_on_backup_done":false}')
local cmds = cjson.decode(ARGV[3])
local tbl, mem, sync = {}, {}, {}
local function entry(p)
  if tbl[p] == nil then tbl[p] = jget(KEYS[2], p) or false end
  return tbl[p]
end
local function member(m)
  if mem[m] == nil then mem[m] = jget(KEYS[1], m) or false end
  return mem[m]
end
local function touch(p, i)
  local e = entry(p)
  if not e then return nil, 'unknown partition ' .. p end
  if (e.c or 0) > coord then return nil, p .. ' was changed by a newer coordinator' end
  e.c = coord
  return e
end
local function over(e)
  if pol.release_on_backup_done and e.b then return true end
  if n < e.t + pol.min_ms then return false end
  if pol.wait_for_backup and not e.b and n < e.t + pol.max_ms then return false end
  return true
end
for i, c in ipairs(cmds) do
  local err
  if c.k == 'expire' then
    local rec = member(c.m)
    if not rec then err = 'unknown member ' .. c.m
    elseif n < rec.x then err = 'member ' .. c.m .. ' is still live'
    else
      if type(rec.p) == 'table' then
        for p, _ in pairs(rec.p) do
          local e = entry(p)
          if holds(e, c.m) then quarantine(e, rec.x); sync[p] = true end
        end
      end
      mem[c.m] = 'removed'
    end
  elseif c.k == 'add' then
    local e = entry(c.p)
    if not e then
      tbl[c.p] = {ph = 'free', e = 0, le = 0, tg = '', c = coord, t = 0, m = ''}
    elseif (e.c or 0) <= coord then e.c = coord end
  elseif c.k == 'target' then
    local e, why = touch(c.p)
    if not e then err = why
    else
      if e.tg ~= c.t then
        if e.tg and e.tg ~= '' then incoming_del(member(e.tg), c.p) end
        if c.t ~= '' and not holds(e, c.t) then incoming_add(member(c.t), c.p) end
      end
      if e.tg ~= c.t then e.ts = n end
      e.tg = c.t
    end
  elseif c.k == 'revoke' then
    local e, why = touch(c.p)
    if not e then err = why
    elseif not (e.ph == 'owned' and e.m == c.m and e.e == c.e) then err = c.p .. ' is ' .. e.ph .. ', not owned by ' .. c.m
    else e.ph = 'draining'; e.t = n end
  elseif c.k == 'free' then
    local e, why = touch(c.p)
    if not e then err = why
    elseif e.ph ~= 'quarantined' then err = c.p .. ' is ' .. e.ph .. ', not quarantined'
    elseif not over(e) then err = c.p .. '\'s quarantine is not over'
    else e.ph = 'free' end
  elseif c.k == 'grant' then
    local rec = member(c.m)
    local e, why = touch(c.p)
    if type(rec) ~= 'table' or n >= rec.x then err = 'member ' .. c.m .. ' is not live'
    elseif not e then err = why
    elseif e.ph ~= 'free' then err = c.p .. ' is ' .. e.ph .. ', not free'
    elseif c.e <= (e.le or 0) then err = 'epoch ' .. c.e .. ' for ' .. c.p .. ' is not above ' .. (e.le or 0)
    else
      e.ph = 'owned'; e.m = c.m; e.e = c.e; e.le = c.e; e.t = n
      held_add(rec, c.p)
      incoming_del(rec, c.p)
      sync[c.p] = true
    end
  else
    err = 'unknown command ' .. tostring(c.k)
  end
  if err then return fail('INVALID', (i - 1) .. ' ' .. err) end
end
-- Everything passed: write.
for p, e in pairs(tbl) do
  if e then
    if e.ph ~= 'owned' and e.ph ~= 'draining' and e.m and e.m ~= '' then
      local rec = member(e.m)
      if type(rec) == 'table' then held_del(rec, p) end
    end
    jset(KEYS[2], p, e)
  end
end
for m, rec in pairs(mem) do
  if rec == 'removed' then redis.call('HDEL', KEYS[1], m)
  elseif rec then jset(KEYS[1], m, rec) end
end
local out = {version}
if #cmds > 0 then out[1] = redis.call('INCR', KEYS[4]) end
for p, _ in pairs(sync) do
  local e = tbl[p]
  table.insert(out, p)
  table.insert(out, e.m or '')
  table.insert(out, e.e or 0)
  table.insert(out, (e.ph == 'owned' or e.ph == 'draining') and 1 or 0)
end
return out
