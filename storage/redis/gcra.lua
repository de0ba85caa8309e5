-- gcra.lua: the twin of Limit.gcra. The state is a string, the theoretical
-- arrival time (TAT): "<µs>" or, with a fraction of a µs, "<µs>:<ticks>";
-- it changes only when a request is admitted or undone.
-- x = inc(cost) in ticks; c1 tau, c2 unit, c4 scale (after bucket.lua).
local function gcra(key, op, now, x, ta, tr, tau, unit, _, scale)
	local commit, _, never = mode(op)
	local v = sget(key)
	if op == 'p' and not v then
		return nil
	end
	local at, frac = 0, 0
	if v then
		local colon = string.find(v, ':', 1, true)
		if colon then
			at, frac = tonumber(string.sub(v, 1, colon - 1)), tonumber(string.sub(v, colon + 1))
		else
			at = tonumber(v)
		end
	end

	-- debt is Limit.gcraDebt: TAT - now in ticks, or 0.
	local debt = 0
	if at >= now then
		if at - now > 4 * 1125899906842624 then
			debt = 9007199254740992
		else
			debt = (at - now) * scale + frac
		end
	end

	-- store is Limit.setTAT: TAT = now + newdebt ticks.
	local function store(newdebt)
		local ms = ttl(micros(newdebt, scale), 0)
		if ms <= 0 then
			sput(key, nil, 0)
			return
		end
		local t = now + quo(newdebt, scale)
		local f = newdebt - quo(newdebt, scale) * scale
		if f == 0 then
			sput(key, t, ms)
		else
			sput(key, int(t) .. ':' .. int(f), ms)
		end
	end

	if op == 'o' then
		if at - now <= 4 * 1125899906842624 then
			store(owe(debt, x))
		end
		return nil
	end

	if op == 'e' then
		-- Limit.LeaseEnd: x unspent events, ta the lease's time, tr its life.
		if debt > 0 then
			store(debt - math.min(leasecredit(x, tr, now - ta, unit, scale), debt))
		end
		return nil
	end

	if op == 'u' then
		if debt > 0 then
			store(debt - giveback(debt, x, now, ta, tr, 0, scale))
		end
		return nil
	end

	local d, level = meter(debt, now, x, commit, tau, unit, 0, scale)
	if commit and d[1] == 1 then
		store(level)
	end
	if never then
		d[1], d[4], d[5] = 0, -1, 0
	end
	return d
end
algs.gc = gcra
