-- sliding_window.lua: the twin of Limit.slidingWindow. The state is a hash
-- {at = window start, level = this window's count, prev = the previous
-- window's count}, counts in milli-units.
-- x = cost in milli-units; c1 window w in µs, c2 limit (events * 1000).
local function slidingwindow(key, op, now, x, w, limit)
	local commit, write, never = mode(op)
	local raw = now
	local s = redis.call('HMGET', key, 'at', 'level', 'prev')
	if op == 'p' and not s[1] then
		return nil
	end
	local before = tonumber(s[1]) or 0
	local at, level, prev
	now, at, level, prev = roll(now, before, tonumber(s[2]) or 0, tonumber(s[3]) or 0, w)
	local e = now - at
	local tonext = w - e

	-- fresh is slidingReset: µs until both windows' counts have slid out.
	local function fresh()
		if level > 0 then
			return tonext + w
		elseif prev > 0 then
			return tonext
		end
		return 0
	end

	local function persist()
		save(key, fresh(), now - raw, 'at', int(at), 'level', int(level), 'prev', int(prev))
	end

	if op == 'u' then
		if at == before then
			level = math.max(0, level - x)
		elseif at - before == w then
			prev = math.max(0, prev - x)
		end
		persist()
		return nil
	end

	-- weight is Limit.weight: prev as it weighs tonext µs before the window
	-- ends, in float64 and in the order Go computes it, so that both round
	-- alike.
	local function weight(p, tn)
		return math.floor(p * tn / w)
	end
	local weighted = weight(prev, tonext)

	-- decayed is Limit.decayed: the least elapsed time in [lo, w] at which
	-- the weight of p has decayed to room or less, found by the same binary
	-- search (the weight never grows with time; at most 51 steps).
	local function decayed(p, room, lo)
		local hi = w
		while lo < hi do
			local mid = lo + math.floor((hi - lo) / 2)
			if weight(p, w - mid) <= room then
				hi = mid
			else
				lo = mid + 1
			end
		end
		return lo
	end

	-- waitfor is Limit.slidingWait: µs until a rejected request fits, in
	-- this window as the previous one's weight decays, or in the next one
	-- as this one's does.
	local function waitfor()
		local room = limit - level - x
		if room >= 0 then
			return decayed(prev, room, e + 1) - e
		end
		return w - e + decayed(level, limit - x, 0)
	end

	local d
	if weighted + level + x > limit then
		d = {0, quo(math.max(0, limit - weighted - level), 1000), fresh(), waitfor(), 0}
	else
		if commit then
			level = level + x
		end
		d = {1, quo(limit - weighted - level, 1000), fresh(), 0, 0}
	end
	if never then
		d[1], d[4] = 0, -1
	end
	if write then
		persist()
	end
	return d
end
algs.sw = slidingwindow
