-- Prepended to every script in lua/ (src/store/redis.rs joins them at build time:
-- a Redis script cannot import another). Scripts run on the Redis clock.
--
-- ARGV[4]  optional: "now" in µs. Only tests pass it; production uses Redis TIME.
-- Needs Redis >= 5 (script effects replication, so TIME may precede writes).
local now
if ARGV[4] then
  now = tonumber(ARGV[4])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- µs to whole ms, rounded up (src/algorithm/mod.rs ceil_ms).
local function ceil_ms(us)
  return math.ceil(us / 1000)
end

-- The first whole ms k >= lo with ok(k), from a closed-form guess: check it, else
-- gallop to a bracket and bisect (src/algorithm/mod.rs settle(), the same steps).
local function settle(guess, lo, ok)
  local k = math.max(guess, lo)
  local good, bad
  local step = 1
  if ok(k) then
    good = k
    while true do
      local below = good - step
      if below < lo then
        bad = lo - 1
        break
      end
      if not ok(below) then
        bad = below
        break
      end
      good = below
      step = step * 2
    end
  else
    bad = k
    while true do
      local above = bad + step
      if ok(above) then
        good = above
        break
      end
      bad = above
      step = step * 2
      if step > 1e15 then
        return above
      end
    end
  end
  while good - bad > 1 do
    local mid = math.floor((bad + good) / 2)
    if ok(mid) then
      good = mid
    else
      bad = mid
    end
  end
  return good
end
