-- sliding_log.lua: the twin of Limit.slidingLog. The state is a list of
-- admission times in µs, oldest first, one entry per event, at most n
-- entries; times only grow along the list, so expired entries are found by
-- binary search and trimmed in one LTRIM.
-- x = the request's events, ceil(cost / 1000); c1 window w in µs, c2 n
-- (events).
local function slidinglog(key, op, now, x, ta, _, w, n)
	local commit, write, never = mode(op)
	local raw = now
	local len = redis.call('LLEN', key)
	if op == 'p' and len == 0 then
		return nil
	end

	local function at(i)
		return tonumber(redis.call('LINDEX', key, i))
	end

	-- persist sets the TTL from the newest entry, or deletes a fresh log.
	local function persist(newest, count)
		local reset = 0
		if count > 0 then
			reset = newest + w - now
		end
		local ms = ttl(reset, now - raw)
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
		persist(newest, len)
		return nil
	end

	-- head is the index of the oldest live entry. A log longer than n (the
	-- limit was lowered) keeps its newest n entries.
	local head = 0
	if len > n then
		head = len - n
	end
	local newest = 0
	if len > head then
		newest = at(-1)
		if now < newest then
			now = newest -- the clock ran backwards: no time has elapsed
		end
		local cutoff = now - w
		if at(head) <= cutoff then
			local lo, hi = head + 1, len
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
	local level = len - head

	local d
	local pushed = false
	if level + x > n then
		local oldest = at(head + level + x - n - 1)
		d = {0, n - level, newest + w - now, oldest + w - now, 0, now}
	else
		if commit and x > 0 then
			level = level + x
			newest = now
			pushed = true
		end
		local reset = 0
		if level > 0 then
			reset = newest + w - now
		end
		d = {1, n - level, reset, 0, 0, now}
	end
	if never then
		d[1], d[4] = 0, -1
	end
	if write then
		if head > 0 then
			redis.call('LTRIM', key, head, -1)
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
