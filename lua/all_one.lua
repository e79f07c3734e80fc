-- The loop of the all-or-nothing script of one group (lua/all.lua says how it is
-- assembled): KEYS, the group's keys (one slot); ARGV, its decisions' items. Returns
-- the group's reply, or raises the error one of its keys raised (the group took
-- nothing).
local flat = {}
local done, e = all_or_nothing(0, #keys, 1, flat, 0)
if not done then
  error(e, 0)
end
return flat
