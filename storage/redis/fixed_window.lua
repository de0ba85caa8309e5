-- fixed_window.lua: the twin of Limit.fixedWindow, and as fixedperiod of
-- Limit.fixedPeriod (a calendar window). The state is a hash {at = the
-- latest time seen (its window is the one that holds it), or for a
-- calendar window its window's start, level = count in milli-units, grant = quota granted for the
-- window in milli-units (absent when none), for a calendar window end =
-- the window's end, and back and leased (see common.lua)}.
-- x = cost in milli-units, or for op 'g' (grant) the amount granted.
-- fixedwindow: c1 window w in µs, c2 limit (events * 1000).
-- fixedperiod: c1, c3, c4 the span's start, mid and end (two calendar
-- windows, as the instance computed them on its own clock), c2 limit.

-- fixeddecide is Limit.fixed: it decides on a state up to date with now
-- whose window ends tonext µs later, and writes it if op writes; a grant
-- ('g') adds x to the grant and answers as a peek for one event. g0 is
-- the grant the key held; ... the state's fields beyond at, level and
-- grant; back and leased the key's leases' (see common.lua).
local function fixeddecide(key, op, now, raw, x, limit, at, level, grant, g0, back, leased, tonext, ...)
	local commit, write, never = mode(op)
	if op == 'g' then
		grant = math.min(grant + x, maxgrant)
		x, write = 1000, true
	end
	limit = limit + grant

	local function fresh()
		if level > 0 or grant > 0 then
			return tonext
		end
		return 0
	end

	if op == 'o' then
		level = owe(level, x)
		if grant ~= g0 then
			save(key, fresh(), now - raw, 'at', at, 'level', level, 'grant', grant, ...)
		else
			save(key, fresh(), now - raw, 'at', at, 'level', level, ...)
		end
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
	if op == 'p' then
		d[7] = grant
	end
	if write then
		if grant ~= g0 then
			save(key, fresh(), now - raw, 'at', at, 'level', level, 'grant', grant, ...)
		else
			save(key, fresh(), now - raw, 'at', at, 'level', level, ...)
		end
	end
	return leasewait(d, back, leased, ceildiv(x, 1000))
end

local function fixedwindow(key, op, now, x, ta, _, w, limit)
	if op == 'e' then
		op, x = 'u', x * 1000 -- Limit.LeaseEnd: x unspent events
	end
	local raw = now
	local s = hget(key, 'at', 'level', 'grant', 'back', 'leased')
	if op == 'p' and not s[1] then
		return nil
	end
	local before = tonumber(s[1]) or 0
	local grant = tonumber(s[3]) or 0
	local g0 = grant
	local start, level
	now, start, level = roll(now, before, tonumber(s[2]) or 0, 0, w)
	local at = now
	if start > before then
		grant = 0 -- a grant ends with its window
	end

	if op == 'u' then
		-- Only to the window it was charged in, if that is this one: cost
		-- taken in an earlier window is already forgotten.
		if start == quo(ta, w) * w then
			level = math.max(0, level - x)
		end
		local reset = 0
		if level > 0 or grant > 0 then
			reset = start + w - now
		end
		if grant ~= g0 then
			save(key, reset, now - raw, 'at', at, 'level', level, 'grant', grant)
		else
			save(key, reset, now - raw, 'at', at, 'level', level)
		end
		return nil
	end
	-- A lease's back is no later than its window's end: one of an
	-- earlier window is past.
	return fixeddecide(key, op, now, raw, x, limit, at, level, grant, g0, tonumber(s[4]) or 0, tonumber(s[5]) or 0, start + w - now)
end
algs.fw = fixedwindow

local function fixedperiod(key, op, now, x, ta, _, s0, limit, s1, s2)
	if op == 'e' then
		op, x = 'u', x * 1000 -- Limit.LeaseEnd: x unspent events
	end
	local raw = now
	local s = hget(key, 'at', 'level', 'grant', 'end', 'back', 'leased')
	if op == 'p' and not s[1] then
		return nil
	end
	local at, level = tonumber(s[1]) or 0, tonumber(s[2]) or 0
	local grant, fin = tonumber(s[3]) or 0, tonumber(s[4]) or 0
	local g0 = grant
	if now < at then
		now = at -- the clock ran backwards: no time has elapsed
	end

	if op == 'u' then
		-- Only to the state's own window, while it lasts.
		if now < fin and at <= ta and ta < fin then
			level = math.max(0, level - x)
			local reset = 0
			if level > 0 or grant > 0 then
				reset = fin - now
			end
			save(key, reset, now - raw, 'at', at, 'level', level, 'end', fin)
		end
		return nil
	end

	if now >= fin then
		-- The state's window is over: the span's period that holds now.
		if s0 <= now and now < s1 then
			at, fin = s0, s1
		elseif s1 <= now and now < s2 then
			at, fin = s1, s2
		else
			error({err = 'TOLLGATE_SPAN calendar window: the server time ' .. int(now) ..
				' is in neither period of the span [' .. int(s0) .. ', ' .. int(s2) .. ') the instance computed'})
		end
		level, grant = 0, 0
	end
	return fixeddecide(key, op, now, raw, x, limit, at, level, grant, g0, tonumber(s[5]) or 0, tonumber(s[6]) or 0, fin - now, 'end', fin)
end
algs.fc = fixedperiod
