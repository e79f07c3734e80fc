-- Which daemon walks a rule's keys after a reload that made the rule keep its state
-- longer (src/store/walk_election.rs; docs/DESIGN.md "Key expiry, clock steps and
-- reloads"). One record per rule and parameters, on the Redis clock:
--
-- KEYS[1]  <prefix>:{walk}:<rule>:<parameters>, a hash {h = the walker's id, s = when
--          its walk starts, e = when its lock ends, d = when the latest walk finished
--          had started}, µs on the Redis clock
-- ARGV[1]  'take': take or renew the lock; 'done': the walk finished (its start is
--          recorded in d, the lock is released); 'drop': release the lock, no record
-- ARGV[2]  this daemon's id
-- ARGV[3]  take: when this daemon's new rule was in force, µs ('' on its first call:
--          now, returned for the next calls)
-- ARGV[4]  take: the lock's lifetime, µs
-- ARGV[5]  take: the delay, µs, between taking the lock and starting the walk
-- ARGV[6]  how long the record is kept, ms
-- Returns  take: {0 = this daemon walks, 1 = another does, 2 = a walk that started
--          after `since` finished: nothing left to do; `since`; the walk's start}.
--          done: 1 if recorded (this daemon still held the lock), else 0. drop: 0.
--
-- A walk started after a daemon's rule was in force covers the keys that daemon wrote
-- under the earlier rule (they existed when the walk began). The delay lets the daemons
-- that reload together be covered by one walk: their `since` is before its start.
-- Hash commands only, which the daemon's ACL already grants.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local op, me = ARGV[1], ARGV[2]
local keep = ARGV[6]
local s = redis.call('HMGET', KEYS[1], 'h', 's', 'e', 'd')
local holder, start, ends, done = s[1], tonumber(s[2]), tonumber(s[3]), tonumber(s[4])
local held = holder and ends and ends > now

if op == 'take' then
  local since = tonumber(ARGV[3]) or now
  if done and done >= since and not (held and holder == me) then
    return {2, since, done}
  end
  if held and holder ~= me then
    return {1, since, start}
  end
  if not (held and holder == me) then
    start = now + tonumber(ARGV[5])
  end
  redis.call('HSET', KEYS[1], 'h', me, 's', string.format('%.0f', start),
    'e', string.format('%.0f', now + tonumber(ARGV[4])))
  redis.call('PEXPIRE', KEYS[1], keep)
  return {0, since, start}
elseif op == 'done' then
  if holder ~= me or not start then
    return 0
  end
  redis.call('HDEL', KEYS[1], 'h', 's', 'e')
  if not done or start > done then
    redis.call('HSET', KEYS[1], 'd', string.format('%.0f', start))
  end
  redis.call('PEXPIRE', KEYS[1], keep)
  return 1
end
if holder == me then
  redis.call('HDEL', KEYS[1], 'h', 's', 'e')
end
return 0
