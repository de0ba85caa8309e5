-- gcra.lua: the twin of Limit.gcra. The state is a string, the theoretical
-- arrival time (TAT) in µs; it changes only when a request is admitted or
-- undone.
-- x = inc(cost) in µs; c1 tau, c2 unit.
local function gcra(key, op, now, x, tau, unit)
	local commit, _, never = mode(op)
	local v = redis.call('GET', key)
	if op == 'p' and not v then
		return nil
	end
	local stored = tonumber(v) or 0

	local function store(newtat)
		local ms = ttl(newtat - now, 0)
		if ms <= 0 then
			redis.call('DEL', key)
			return
		end
		redis.call('SET', key, int(newtat), 'PX', ms)
	end

	if op == 'u' then
		local newtat = stored - x
		if newtat < now then
			newtat = now
		end
		store(newtat)
		return nil
	end

	local tat = stored
	if tat < now then
		tat = now
	end
	local debt = tat - now
	local over = debt + x - tau
	if over > 0 then
		if never then
			return {0, units(tau - debt, unit), debt, -1, 0}
		end
		return {0, units(tau - debt, unit), debt, over, 0}
	end
	if commit then
		tat = tat + x
		debt = debt + x
		store(tat)
	end
	if never then
		return {0, units(tau - debt, unit), debt, -1, 0}
	end
	return {1, units(tau - debt, unit), debt, 0, 0}
end
algs.gc = gcra
