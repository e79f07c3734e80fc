-- The loop of the give-back script (lua/give_back.lua says how it is assembled).
--
-- KEYS[i]  item i's key
-- ARGV     per item: its algorithm's index (0-based), the count n of its arguments
--          (4), then its own script's parameters (two), the units to give back (µ-units
--          for buckets), and the instant of the reservation being undone, µs ('' for a
--          REFUND)
-- Returns  per item seven integers, flat: the CHECK fields of a cost of 0 after the
--          give-back (allowed, remaining, reset_ms, wait_ms), then the key's run-time
--          override as prelude.lua tiered() reports it (limit, rate or window halves),
--          or three 0s without one
local base = now
-- An item's algorithm index and argument count are single digits: a table lookup is
-- cheaper than tonumber()'s strtod. `args` is made with room for five arguments.
local digit = {['0'] = 0, ['1'] = 1, ['2'] = 2, ['3'] = 3, ['4'] = 4, ['5'] = 5,
  ['6'] = 6, ['7'] = 7, ['8'] = 8, ['9'] = 9}
local flat = {}
local at = 1
for i = 1, #keys do
  local kind, n = digit[items[at]] or tonumber(items[at]), digit[items[at + 1]] or tonumber(items[at + 1])
  local args = {nil, nil, nil, nil, nil}
  for j = 1, n do
    args[j] = items[at + 1 + j]
  end
  at = at + 2 + n
  now, clock, dry = base, base, false
  KEYS[1] = keys[i]
  local instant = nil
  if args[4] and args[4] ~= '' then
    instant = tonumber(args[4])
  end
  -- Capped at the key's run-time override if it has one (give_back.lua override_of()).
  override_of(args)
  give_backs[kind + 1](args, instant)
  now, clock, dry = base, base, false
  local r = algorithms[kind + 1]({args[1], args[2], 0, '', '1'})
  flat[#flat + 1] = r[1]
  flat[#flat + 1] = r[2]
  flat[#flat + 1] = r[3]
  flat[#flat + 1] = r[4]
  flat[#flat + 1] = r[5] or 0
  flat[#flat + 1] = r[6] or 0
  flat[#flat + 1] = r[7] or 0
end
return flat
