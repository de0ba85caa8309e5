-- fixed_window.lua: the twin of Limit.fixedWindow. The state is a hash
-- {at = window start, level = count in milli-units}.
-- x = cost in milli-units; c1 window w in µs, c2 limit (events * 1000).
local function fixedwindow(key, op, now, x, ta, _, w, limit)
	local commit, write, never = mode(op)
	local raw = now
	local s = redis.call('HMGET', key, 'at', 'level')
	if op == 'p' and not s[1] then
		return nil
	end
	local before = tonumber(s[1]) or 0
	local at, level
	now, at, level = roll(now, before, tonumber(s[2]) or 0, 0, w)
	local tonext = at + w - now

	local function fresh()
		if level > 0 then
			return tonext
		end
		return 0
	end

	if op == 'o' then
		level = owe(level, x)
		save(key, fresh(), now - raw, 'at', at, 'level', level)
		return nil
	end

	if op == 'u' then
		-- Only to the window it was charged in, if that is this one: cost
		-- taken in an earlier window is already forgotten.
		if at == quo(ta, w) * w then
			level = math.max(0, level - x)
		end
		save(key, fresh(), now - raw, 'at', at, 'level', level)
		return nil
	end

	local d
	if level + x > limit then
		d = {0, quo(limit - level, 1000), tonext, tonext, 0, now}
	else
		if commit then
			level = level + x
		end
		d = {1, quo(limit - level, 1000), fresh(), 0, 0, now}
	end
	if never then
		d[1], d[4] = 0, -1
	end
	if write then
		save(key, fresh(), now - raw, 'at', at, 'level', level)
	end
	return d
end
algs.fw = fixedwindow
