-- sliding_window.lua: the twin of Limit.slidingWindow. The state is a hash
-- {at = the latest time seen (the current window is the one that holds
-- it), level = this window's count, prev = the previous
-- window's count, grant = quota granted for this window (absent when
-- none), back and leased (see common.lua)}, counts in milli-units.
-- x = cost in milli-units, or for op 'g' (grant) the amount granted;
-- c1 window w in µs, c2 limit (events * 1000).

-- mulcmp is mulCmp: it compares a*b with c*d exactly, for integers in
-- [0, 2^52), by splitting each factor into 26-bit limbs (each partial
-- product then stays below 2^53, exact in a double). It returns -1, 0 or 1.
local limb = 67108864 -- 2^26
local function product(a, b)
	local a1, a0 = math.floor(a / limb), a % limb
	local b1, b0 = math.floor(b / limb), b % limb
	local p0 = a0 * b0
	local p1 = a1 * b0 + a0 * b1
	local p2 = a1 * b1
	local lo = p0 % limb
	local mid = p1 + math.floor(p0 / limb)
	return p2 + math.floor(mid / limb), mid % limb, lo
end
local function mulcmp(a, b, c, d)
	local x2, x1, x0 = product(a, b)
	local y2, y1, y0 = product(c, d)
	if x2 ~= y2 then
		return x2 < y2 and -1 or 1
	elseif x1 ~= y1 then
		return x1 < y1 and -1 or 1
	elseif x0 ~= y0 then
		return x0 < y0 and -1 or 1
	end
	return 0
end

local function slidingwindow(key, op, now, x, ta, _, w, limit)
	if op == 'e' then
		op, x = 'u', x * 1000 -- Limit.LeaseEnd: x unspent events
	end
	local commit, write, never = mode(op)
	local raw = now
	local s = hget(key, 'at', 'level', 'prev', 'grant', 'back', 'leased')
	if op == 'p' and not s[1] then
		return nil
	end
	local before = tonumber(s[1]) or 0
	local grant = tonumber(s[4]) or 0
	local g0 = grant
	local start, level, prev
	now, start, level, prev = roll(now, before, tonumber(s[2]) or 0, tonumber(s[3]) or 0, w)
	local at = now
	if start > before then
		-- A grant ends with its window, and so does what it admitted: the
		-- next window weighs only the rest.
		prev = math.max(0, prev - grant)
		grant = 0
	end
	if op == 'g' then
		grant = math.min(grant + x, maxgrant)
		x = 1000
	end
	local e = now - start
	local tonext = w - e

	-- fresh is slidingReset: µs until both windows' counts have slid out.
	local function fresh()
		if level > grant then
			return tonext + w
		elseif prev > 0 or level > 0 or grant > 0 then
			return tonext
		end
		return 0
	end

	local function persist()
		if grant ~= g0 then
			save(key, fresh(), now - raw, 'at', at, 'level', level, 'prev', prev, 'grant', grant)
		else
			save(key, fresh(), now - raw, 'at', at, 'level', level, 'prev', prev)
		end
	end

	if op == 'o' then
		level = owe(level, x)
		persist()
		return nil
	end

	if op == 'u' then
		-- To the window it was charged in, while the state counts it.
		local charged = quo(ta, w) * w
		if charged == start then
			level = math.max(0, level - x)
		elseif charged == start - w then
			prev = math.max(0, prev - x)
		end
		persist()
		return nil
	end

	-- weight is Limit.weight: ceil(p * tn / w), exactly: a float estimate
	-- corrected by exact comparisons.
	local function weight(p, tn)
		if p <= 0 or tn <= 0 then
			return 0
		end
		local q = math.ceil(p * tn / w)
		while q > 0 and mulcmp(q - 1, w, p, tn) >= 0 do
			q = q - 1
		end
		while mulcmp(q, w, p, tn) < 0 do
			q = q + 1
		end
		return q
	end
	local weighted = weight(prev, tonext)

	-- decayed is Limit.decayed: the least elapsed time in [lo, w] at which
	-- p * (w - e') <= room * w (the weight never grows with time; at most
	-- 51 steps).
	local function decayed(p, room, lo)
		local hi = w
		while lo < hi do
			local mid = lo + math.floor((hi - lo) / 2)
			if mulcmp(p, w - mid, room, w) <= 0 then
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
		local room = limit + grant - level - x
		if room >= 0 then
			return decayed(prev, room, e + 1) - e
		end
		return w - e + decayed(math.max(0, level - grant), limit - x, 0)
	end

	local d
	local cap = limit + grant
	if weighted + level + x > cap then
		d = {0, quo(math.max(0, cap - weighted - level), 1000), fresh(), waitfor(), 0, now}
	else
		if commit then
			level = level + x
		end
		d = {1, quo(cap - weighted - level, 1000), fresh(), 0, 0, now}
	end
	if never then
		d[1], d[4] = 0, -1
	end
	if op == 'p' then
		d[7] = grant
	end
	if write or op == 'g' then
		persist()
	end
	return leasewait(d, tonumber(s[5]) or 0, tonumber(s[6]) or 0, ceildiv(x, 1000))
end
algs.sw = slidingwindow
