-- ban.lua: the twin of Limit.banned and Limit.Strike. The state is a hash
-- {at = the ban's end, level = strikes in the strike window, prev = the
-- strike window's end}, all µs.
-- op 's' records a strike (a rejection of the key by its zone); every
-- other op only looks: a ban is never charged by a request.
-- c1 = strike window in µs, c2 = strikes that ban (ban_after), c3 = the
-- ban's length in µs.
local function ban(key, op, now, _, _, _, w, after, hold)
	local s = redis.call('HMGET', key, 'at', 'level', 'prev')
	if op == 'p' and not s[1] then
		return nil
	end
	if op == 'u' then
		return nil
	end
	local at, level, prev = tonumber(s[1]) or 0, tonumber(s[2]) or 0, tonumber(s[3]) or 0

	local function decide()
		if now < at then
			return {0, 0, at - now, at - now, 0, now}
		end
		if level == 0 or now >= prev then
			return {1, after, 0, 0, 0, now}
		end
		return {1, after - level, prev - now, 0, 0, now}
	end

	if op ~= 's' or now < at then
		return decide()
	end
	if level == 0 or now >= prev then
		level, prev = 0, now + w
	end
	level = level + 1
	if level >= after then
		at, level, prev = now + hold, 0, 0
	end
	local d = decide()
	save(key, d[3], 0, 'at', at, 'level', level, 'prev', prev)
	return d
end
algs.bn = ban
