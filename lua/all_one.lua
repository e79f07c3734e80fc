-- The loop of the all-or-nothing script of one group (lua/all.lua says how it is
-- assembled): KEYS, the group's keys (one slot); ARGV, its decisions' items. Returns
-- the group's reply.
local parsed = parse_items(#keys, 1)
local flat = {}
all_or_nothing(keys, parsed, flat)
return flat
