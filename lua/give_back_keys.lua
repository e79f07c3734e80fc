-- Units given back to several keys in turn (lua/give_back.lua says how the scripts
-- that give back are built), for the give-back script's loop (lua/give_back_loop.lua)
-- and the give-backs an all-or-nothing batch carries (lua/all_batch.lua).
--
-- give_back_keys(first, count, at, flat, base, ov) gives back to the `count` keys
-- keys[first + 1 ..], their items from items[at] on. An item: its algorithm's index
-- (0-based), the count n of its arguments (4), then its own script's parameters (two),
-- the units to give back (µ-units for buckets) and the instant of the reservation
-- being undone, µs ('' for a REFUND). Each key is given back from `base` (the call's
-- TIME), capped at its run-time override if it has one, then reported as a dry run of
-- a cost of 0: seven integers appended to `flat` (the CHECK fields after the give-back:
-- allowed, remaining, reset_ms, wait_ms; then the override as prelude.lua tiered()
-- reports it, or three 0s). `ov[i]`, when `ov` is given, is key i's ov field as a
-- pcall'd HMGET read it already (lua/all_batch.lua reads every key of a give-back
-- before any is written). Returns where the next item starts. A key's error stops
-- it there, raised: the keys before it were given back, the others not, as when the
-- give-back script itself fails.
-- An item's algorithm index and argument count are single digits: a table lookup is
-- cheaper than tonumber()'s strtod.
local give_back_digit = {['0'] = 0, ['1'] = 1, ['2'] = 2, ['3'] = 3, ['4'] = 4,
  ['5'] = 5, ['6'] = 6, ['7'] = 7, ['8'] = 8, ['9'] = 9}
local function give_back_keys(first, count, at, flat, base, ov)
  local digit = give_back_digit
  for i = 1, count do
    local kind = digit[items[at]] or tonumber(items[at])
    local n = digit[items[at + 1]] or tonumber(items[at + 1])
    local args = {nil, nil, nil, nil, nil}
    for j = 1, n do
      args[j] = items[at + 1 + j]
    end
    at = at + 2 + n
    now, clock, dry = base, base, false
    KEYS[1] = keys[first + i]
    local instant = nil
    if args[4] and args[4] ~= '' then
      instant = tonumber(args[4])
    end
    -- Capped at the key's run-time override if it has one (give_back.lua override_of()).
    override_of(args, ov and ov[i])
    give_backs[kind + 1](args, instant)
    now, clock, dry = base, base, false
    local r = algorithms[kind + 1]({args[1], args[2], 0, '', '1'})
    local w = #flat
    flat[w + 1], flat[w + 2], flat[w + 3], flat[w + 4] = r[1], r[2], r[3], r[4]
    flat[w + 5], flat[w + 6], flat[w + 7] = r[5] or 0, r[6] or 0, r[7] or 0
  end
  return at
end
