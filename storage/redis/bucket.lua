-- bucket.lua: token_bucket and leaky_bucket, the twin of Limit.bucket.
-- The state is a hash {at = last refill, level = debt in µs}.
-- x = inc(cost) in µs; c1 tau, c2 unit, c3 max delay (0 polices; > 0
-- shapes).
local function bucket(key, op, now, x, tau, unit, maxdelay)
	local commit, write, never = mode(op)
	local raw = now
	local s = redis.call('HMGET', key, 'at', 'level')
	if op == 'p' and not s[1] then
		return nil
	end
	local at = tonumber(s[1]) or 0
	local level = tonumber(s[2]) or 0

	if now < at then
		now = at -- the clock ran backwards: no time has elapsed
	end
	local debt = level - (now - at)
	if debt < 0 then
		debt = 0
	end
	at, level = now, debt

	if op == 'u' then
		level = level - x
		if level < 0 then
			level = 0
		end
		save(key, level, now - raw, 'at', int(at), 'level', int(level))
		return nil
	end

	local allowed, remaining, reset, wait, delay = 0, 0, 0, 0, 0
	local over = debt + x - tau
	if over <= 0 then
		if commit then
			level = debt + x
		end
		allowed, remaining, reset = 1, units(tau - level, unit), level
	elseif maxdelay > 0 and over <= maxdelay then
		if commit then
			level = debt + x
		end
		allowed, reset, delay = 1, level, over
	else
		remaining, reset, wait = units(tau - debt, unit), debt, over - maxdelay
	end
	if never then
		allowed, wait, delay = 0, -1, 0
	end
	if write then
		save(key, level, now - raw, 'at', int(at), 'level', int(level))
	end
	return {allowed, remaining, reset, wait, delay}
end
algs.tb = bucket
algs.lb = bucket
