-- The leases a token bucket's key may hold, as the per-request script sees them:
-- prepended to token_bucket.lua (after prelude.lua) by the `spec!` macro, and shared by
-- the batch scripts and the give-back script that embed it.
--
-- A daemon with `lease = "off"` beside daemons that still take leases (a reload that
-- turns leases off reaches a fleet one daemon at a time) decides the key with the
-- per-request script, which reads the fields it names, not the leases (l:<holder>, one
-- per holder). The lease script keeps their sum in one field (lease_token_bucket.lua):
--   o = "<capacity out> <refill promised> <latest deadline>"
-- µ-tokens on lease, µ-tokens/s refilled on slices, µs on the Redis clock. Until that
-- deadline the bucket holds at most the capacity less what is out and refills slower by
-- what is promised, as the lease script keeps it; then at the full rate up to the
-- capacity (the leases' unspent units lapse). A key without the field is refilled as
-- before: the same reply and state as the Rust twin.

-- The µ-tokens at `t` (≥ `ts`) of a bucket of `cap` µ-tokens refilled at `rate`
-- µ-tokens/µs that held `tokens` at `ts`, with the leases of `o` (nil: none); and the
-- most it may hold at `t`.
local function refill_leased(o, cap, rate, tokens, ts, t)
  local out, promised, until_us = 0, 0, 0
  if o then
    local a, b, d = string.match(o, '^(%d+) (%d+) (%d+)$')
    if a then
      out, promised, until_us = tonumber(a), tonumber(b), tonumber(d)
    end
  end
  if ts >= until_us then
    return math.min(cap, tokens + math.floor((t - ts) * rate)), cap
  end
  local own = math.max(rate - promised / 1000000, 0)
  local level = math.min(cap - out, tokens + math.floor((math.min(t, until_us) - ts) * own))
  if t < until_us then
    return level, cap - out
  end
  return math.min(cap, level + math.floor((t - until_us) * rate)), cap
end
