-- One replica's lease exchange, run atomically by the store (EVALSHA).
--
-- KEYS[i]  the hash of worker i: field per replica id -> "seq expiry held grant demand limit"
--          (expiry in the store's clock, ms).
-- ARGV     replica id, sequence number, lease TTL in ms, the group's push channel, then per
--          worker: limit, held, demand.
-- Returns  per worker {share, group limit, live replicas, contended}: contended is 1 when some
--          live replica (this one included) wants more than it was granted, which makes the
--          replicas exchange every poll (a fortieth of the interval) until the shares
--          have moved.
-- Pushes   on the channel, after the exchange: 'want ID' when, on some worker, the caller wants
--          more than it was granted (others may hold more than their new share, or units they
--          do not use, and should say so); 'free ID' when the caller handed back part of what
--          it held while another replica wants more (that one may now be granted it).
--          Replicas listening exchange at once instead of at their next poll, each only for
--          what it can act on.
--
-- Safety: a replica may have in flight up to max(held, grant) of what it last reported and
-- was granted, so a grant never exceeds the group limit minus that of every other live
-- replica. A store up for less than one TTL may have lost leases that replicas still use (it
-- restarted), so until then a replica keeps at most what it already holds: by then every
-- replica has either re-registered or stopped using its old leases.
-- `amount` split over `ids` in proportion to `weight(id)` (integers, total above 0): each gets
-- the floor of its part, the leftover (fewer units than ids) goes to the largest fractions, ties
-- to the smaller id.
local function apportion(ids, amount, weight)
  local total, parts, fracs, rest = 0, {}, {}, amount
  for _, id in ipairs(ids) do
    total = total + weight(id)
  end
  for _, id in ipairs(ids) do
    local scaled = weight(id) * amount
    parts[id] = math.floor(scaled / total)
    rest = rest - parts[id]
    fracs[#fracs + 1] = {id = id, f = scaled - parts[id] * total}
  end
  table.sort(fracs, function(x, y)
    if x.f ~= y.f then
      return x.f > y.f
    end
    return x.id < y.id
  end)
  for k = 1, rest do
    parts[fracs[k].id] = parts[fracs[k].id] + 1
  end
  return parts
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local me, seq, ttl, channel = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local uptime = tonumber(string.match(redis.call('INFO', 'server'), 'uptime_in_seconds:(%d+)'))
local young = uptime == nil or uptime * 1000 < ttl
local out = {}
local want, free = false, false
for i, key in ipairs(KEYS) do
  local a = 4 + (i - 1) * 3
  local limit, held, demand = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local raw = redis.call('HGETALL', key)
  local live, ids = {}, {}
  for j = 1, #raw, 2 do
    local f = raw[j]
    local s, e, h, g, d, n = string.match(raw[j + 1], '^(%d+) (%d+) (%d+) (%d+) (%d+) (%d+)$')
    if s and tonumber(e) > now then
      live[f] = {seq = tonumber(s), held = tonumber(h), grant = tonumber(g),
                 demand = tonumber(d), limit = tonumber(n)}
      ids[#ids + 1] = f
    else
      redis.call('HDEL', key, f)
    end
  end
  local stale = live[me] ~= nil and live[me].seq >= seq
  -- What this replica could have in flight before this report (for 'free').
  local before = live[me] and math.max(live[me].held, live[me].grant) or 0
  if not stale then
    if live[me] == nil then
      ids[#ids + 1] = me
    end
    live[me] = {seq = seq, held = held, grant = 0, demand = demand, limit = limit}
  end
  table.sort(ids)
  local n = limit
  for _, id in ipairs(ids) do
    n = math.min(n, live[id].limit)
  end
  if not stale then
    -- Targets. Total demand within N: everyone gets its demand, the spare goes to everyone
    -- in proportion to demand + 1. Beyond N: in proportion to demand,
    -- so every replica's queue drains at the same pace, as one router's FIFO would (a replica
    -- whose small demand rounds to nothing grows its queue, hence its demand, until it counts).
    local total, target = 0, {}
    for _, id in ipairs(ids) do
      total = total + live[id].demand
    end
    if total <= n then
      -- The next arrivals most likely come where requests already run; an idle replica
      -- still keeps a part for a burst.
      local spare = apportion(ids, n - total, function(id) return live[id].demand + 1 end)
      for _, id in ipairs(ids) do
        target[id] = live[id].demand + spare[id]
      end
    else
      target = apportion(ids, n, function(id) return live[id].demand end)
    end
    local others = 0
    for _, id in ipairs(ids) do
      if id ~= me then
        others = others + math.max(live[id].held, live[id].grant)
      end
    end
    local grant = math.max(0, math.min(target[me], n - others))
    if young then
      grant = math.min(grant, held)
    end
    live[me].grant = grant
    redis.call('HSET', key, me,
      string.format('%d %d %d %d %d %d', seq, now + ttl, held, grant, demand, limit))
    redis.call('PEXPIRE', key, ttl * 2)
  end
  local contended, others_want = 0, false
  for _, id in ipairs(ids) do
    if live[id].demand > live[id].grant then
      contended = 1
      if id ~= me then
        others_want = true
      end
    end
  end
  if not stale then
    local mine = live[me]
    if mine.demand > mine.grant then
      want = true
    end
    if others_want and mine.held < before then
      free = true
    end
  end
  out[i] = {live[me].grant, n, #ids, contended}
end
-- pcall: a store whose ACL refuses PUBLISH still shares limits, at the pace of the polls.
if want then
  redis.pcall('PUBLISH', channel, 'want ' .. me)
end
if free then
  redis.pcall('PUBLISH', channel, 'free ' .. me)
end
return out
