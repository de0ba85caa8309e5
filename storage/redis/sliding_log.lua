-- sliding_log.lua: the twin of Limit.slidingLog. The state is a list of
-- admission times in µs, oldest first, one entry per event; times only
-- grow along the list, so expired entries are found by binary search and
-- trimmed in one LTRIM. A grant (op 'g') is kept ahead of the entries as
-- two negative numbers, -(its end in µs) and -(its amount in
-- milli-units), which no time is: while it lasts the log may hold n and
-- its whole events.
-- x = the request's events, ceil(cost / 1000), or for op 'g' the amount
-- granted in milli-units; c1 window w in µs, c2 n (events).
local maxloggrant = 100000000 -- MaxLogGrant: 100,000 events
local function slidinglog(key, op, now, x, ta, _, w, n)
	local commit, write, never = mode(op)
	local raw = now
	local len = redis.call('LLEN', key)
	if op == 'p' and len == 0 then
		return nil
	end

	-- base is where the entries start: 2 after a grant, else 0.
	local base, gend, gamt, first = 0, 0, 0, nil
	if len > 0 then
		first = tonumber(redis.call('LINDEX', key, 0))
		if first < 0 then
			base, gend = 2, -first
			gamt = -tonumber(redis.call('LINDEX', key, 1))
		end
	end
	len = len - base

	local function at(i)
		if i < 0 then
			return tonumber(redis.call('LINDEX', key, i))
		end
		return tonumber(redis.call('LINDEX', key, base + i))
	end

	-- logreset is Limit.logReset: µs until the newest of count entries
	-- has left the window and the grant has ended.
	local function logreset(newest, count)
		local r = 0
		if count > 0 then
			r = newest + w - now
		end
		if gamt > 0 then
			r = math.max(r, gend - now)
		end
		return r
	end

	-- persist sets the TTL from the newest entry and the grant's end, or
	-- deletes a fresh log.
	local function persist(newest, count)
		local ms = ttl(logreset(newest, count), now - raw)
		if ms <= 0 then
			redis.call('DEL', key)
		else
			redis.call('PEXPIRE', key, ms)
		end
	end

	if op == 'u' then
		-- Remove up to x entries made at ta, the request's own, as
		-- Limit.slidingLogUndo does.
		if x > 0 and len > 0 then
			len = len - redis.call('LREM', key, x, ta)
		end
		local newest = 0
		if len > 0 then
			newest = at(-1)
			if now < newest then
				now = newest
			end
			if newest <= now - w then
				len = 0
			end
		end
		if gamt > 0 and now >= gend then
			gamt = 0
		end
		persist(newest, len)
		return nil
	end

	-- head is the index of the oldest live entry. A log may hold more than
	-- n (the limit was lowered, or a grant ended): each entry counts until
	-- it leaves the window.
	local head = 0
	local newest = 0
	if len > 0 then
		newest = at(-1)
		if now < newest then
			now = newest -- the clock ran backwards: no time has elapsed
		end
		local cutoff = now - w
		if base > 0 then
			first = at(0)
		end
		if first <= cutoff then
			local lo, hi = 1, len
			while lo < hi do
				local mid = math.floor((lo + hi) / 2)
				if at(mid) <= cutoff then
					lo = mid + 1
				else
					hi = mid
				end
			end
			head = lo
		end
	end
	local g0 = gamt
	if gamt > 0 and now >= gend then
		gamt = 0 -- the grant has ended
	end
	if op == 'g' then
		gamt, gend = math.min(gamt + x, maxloggrant), now + w
		x = 1
	end
	local g = quo(gamt, 1000)
	local level = len - head

	local function fresh()
		return logreset(newest, level)
	end

	local d
	local pushed = false
	local cap = n + g
	if level + x > cap then
		local wait = at(head + level + x - cap - 1) + w - now
		if g > 0 and now + wait >= gend then
			-- The grant ends first: then the log must hold at most n.
			wait = math.max(gend, at(head + level + x - n - 1) + w) - now
		end
		d = {0, math.max(0, cap - level), fresh(), wait, 0, now}
	else
		if commit and x > 0 then
			level = level + x
			newest = now
			pushed = true
		end
		d = {1, cap - level, fresh(), 0, 0, now}
	end
	if never then
		d[1], d[4] = 0, -1
	end
	if op == 'p' then
		d[7] = gamt
	end
	if write or op == 'g' then
		-- Expired entries go, and the grant's two numbers with them when
		-- they are ahead of those or have changed; a grant that lasts is
		-- put back ahead of the entries.
		local header = base > 0
		if head > 0 or (header and gamt ~= g0) or op == 'g' then
			if base + head > 0 then
				redis.call('LTRIM', key, base + head, -1)
			end
			header = false
		end
		if gamt > 0 and not header then
			redis.call('LPUSH', key, int(-gamt), int(-gend))
		end
		if pushed then
			local t = int(now)
			local batch = {}
			for i = 1, math.min(x, 1000) do
				batch[i] = t
			end
			local left = x
			while left > 0 do
				if left < #batch then
					for i = left + 1, #batch do
						batch[i] = nil
					end
				end
				redis.call('RPUSH', key, unpack(batch))
				left = left - #batch
			end
		end
		persist(newest, level)
	end
	return d
end
algs.sl = slidinglog
