-- fixed_window.lua: the twin of Limit.fixedWindow. The state is a hash
-- {at = window start, level = count in milli-units}.
-- x = cost in milli-units; ARGV[5] window w in µs, ARGV[6] limit
-- (events * 1000).
local w = tonumber(ARGV[5])
local limit = tonumber(ARGV[6])

local s = redis.call('HMGET', key, 'at', 'level')
if op == 'p' and not s[1] then
	return {}
end
local before = tonumber(s[1]) or 0
local at, level = roll(before, tonumber(s[2]) or 0, 0, w)
local tonext = at + w - now

local function fresh()
	if level > 0 then
		return tonext
	end
	return 0
end

if op == 'u' then
	-- Cost taken in an earlier window is already forgotten.
	if at == before then
		level = math.max(0, level - x)
	end
	save(fresh(), 'at', int(at), 'level', int(level))
	return {}
end

local d
if level + x > limit then
	d = {0, quo(limit - level, 1000), tonext, tonext, 0}
else
	if commit then
		level = level + x
	end
	d = {1, quo(limit - level, 1000), fresh(), 0, 0}
end
if op == 'r' then
	d[1], d[4] = 0, -1
end
if write then
	save(fresh(), 'at', int(at), 'level', int(level))
end
return d
