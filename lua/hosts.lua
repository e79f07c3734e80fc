-- The daemons alive, for fallback.hosts = "auto" (src/store/hosts.rs): each daemon
-- runs this every second; the share a local bucket enforces while Redis is unreachable
-- is limit ÷ the count it returned last.
--
-- KEYS[1]  <prefix>:{hosts}, a sorted set: member = a daemon's id, score = its last
--          heartbeat, µs on the Redis clock
-- ARGV[1]  this daemon's id
-- ARGV[2]  how long a heartbeat counts, µs
-- Returns  the daemons whose last heartbeat is that recent, this one included.
--
-- Heartbeats older than ARGV[2] are removed; the key expires 1 s after the newest
-- would, so a fleet that is gone leaves nothing behind.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local alive = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.0f', now - alive))
redis.call('ZADD', KEYS[1], string.format('%.0f', now), ARGV[1])
redis.call('PEXPIRE', KEYS[1], string.format('%.0f', math.ceil(alive / 1000) + 1000))
-- Counted with ZRANGE, a command the daemon's least-privilege ACL already grants: O(n)
-- in the daemons alive, once a second per daemon (ZCARD would be O(1) but needs +zcard).
return #redis.call('ZRANGE', KEYS[1], 0, -1)
