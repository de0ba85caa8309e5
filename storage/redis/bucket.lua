-- bucket.lua: token_bucket and leaky_bucket, the twin of Limit.bucket.
-- The state is a hash {at = last refill in µs, level = debt in ticks of
-- 1/scale µs, and back and leased, see common.lua}.
-- x = inc(cost) in ticks; c1 tau (ticks), c2 unit (ticks), c3 max delay
-- (µs; 0 polices, > 0 shapes), c4 scale (ticks per µs).

-- drain is Limit.drain: debt ticks after elapsed µs.
local function drain(debt, elapsed, scale)
	if elapsed <= 0 then
		return debt
	end
	if elapsed >= micros(debt, scale) then
		return 0
	end
	return debt - elapsed * scale
end

-- meter is Limit.meter: the decision of x against debt at now; it returns
-- the decision and the new debt.
local function meter(debt, now, x, commit, tau, unit, maxdelay, scale)
	local level = debt
	local over = debt + x - tau
	if over <= 0 then
		if commit then
			level = debt + x
		end
		return {1, units(tau - level, unit), micros(level, scale), 0, 0, now}, level
	elseif maxdelay > 0 and over <= maxdelay * scale then
		if commit then
			level = debt + x
		end
		return {1, 0, micros(level, scale), 0, micros(over, scale), now}, level
	end
	return {0, units(tau - debt, unit), micros(debt, scale), micros(over - maxdelay * scale, scale), 0, now}, level
end

-- giveback is Limit.giveBack: what an undo of x, charged by the decision
-- that reported ta and tr (its At and Reset), gives back from debt at now:
-- never more than the charge still holds.
local function giveback(debt, x, now, ta, tr, maxdelay, scale)
	if ta + tr == now + micros(debt, scale) then
		return math.min(x, debt) -- the last charge in the queue
	end
	if maxdelay > 0 then
		return 0
	end
	local elapsed = math.max(0, now - ta)
	if elapsed >= micros(x, scale) then
		return 0
	end
	return math.max(0, math.min(x - elapsed * scale, debt))
end

-- leasecredit is Limit.LeaseCredit for the bucket family: what a lease
-- that lived life µs gives back elapsed µs after it was taken with
-- unspent events, in ticks.
local function leasecredit(unspent, life, elapsed, unit, scale)
	return math.max(0, math.max(unspent, 0) * unit + (life - math.max(elapsed, 0)) * scale)
end

local function bucket(key, op, now, x, ta, tr, tau, unit, maxdelay, scale)
	local commit, write, never = mode(op)
	local raw = now
	local s = hget(key, 'at', 'level', 'back', 'leased')
	if op == 'p' and not s[1] then
		return nil
	end
	local at = tonumber(s[1]) or 0
	local level = tonumber(s[2]) or 0

	if now < at then
		now = at -- the clock ran backwards: no time has elapsed
	end
	local debt = drain(level, now - at, scale)
	at, level = now, debt

	if op == 'o' then
		level = owe(level, x)
	elseif op == 'u' then
		level = level - giveback(level, x, now, ta, tr, maxdelay, scale)
	elseif op == 'e' then
		level = level - math.min(leasecredit(x, tr, now - ta, unit, scale), level)
	end
	if op == 'u' or op == 'o' or op == 'e' then
		save(key, micros(level, scale), now - raw, 'at', at, 'level', level)
		return nil
	end

	local d
	d, level = meter(debt, now, x, commit, tau, unit, maxdelay, scale)
	if never then
		d[1], d[4], d[5] = 0, -1, 0
	end
	if write then
		save(key, micros(level, scale), now - raw, 'at', at, 'level', level)
	end
	return leasewait(d, tonumber(s[3]) or 0, tonumber(s[4]) or 0, ceildiv(x, unit))
end
algs.tb = bucket
algs.lb = bucket
