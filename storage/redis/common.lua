-- common.lua: the prologue of every Tollgate script; the Go code prepends
-- it to each algorithm's script. Each script decides for one key, KEYS[1],
-- and is the Lua twin of its Go algorithm in package algorithms: the Go side
-- passes every derived constant, so that the Lua only adds, compares and
-- divides integers below 2^53, which doubles hold exactly.
--
-- ARGV[1] op:    't' take, 'r' reject (cost above capacity: decide for
--                cost 0, charge nothing), 'p' peek (read only), 'u' undo
-- ARGV[2] now:   µs since the Unix epoch; negative means the server's
--                clock (production always passes -1)
-- ARGV[3] slack: ms added to every TTL (0 in production; tests add some so
--                that keys outlive a clock that tests hold still)
-- ARGV[4] x:     the request's cost as the algorithm counts it
-- ARGV[5...]:    the algorithm's constants
--
-- A script returns {allowed, remaining, reset, wait, delay} as integers,
-- or {} for a peek at a key that does not exist.

-- Redis before 5 replicated scripts verbatim and refused writes after TIME.
if redis.replicate_commands then
	redis.replicate_commands()
end

local key = KEYS[1]
local op = ARGV[1]
local now = tonumber(ARGV[2])
if now < 0 then
	local t = redis.call('TIME')
	now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
-- raw is the clock reading before an algorithm holds it at the stored time
-- (a clock that ran backwards); TTLs run on the raw clock.
local raw = now
local slack = tonumber(ARGV[3])
local x = tonumber(ARGV[4])
local commit = op == 't'
local write = op ~= 'p'

-- quo returns a / b truncated toward zero, as Go's integer division does,
-- exactly for |a| < 2^53 and b > 0 (the floor of a rounded quotient is
-- corrected by one if it is off).
local function quo(a, b)
	local neg = a < 0
	if neg then
		a = -a
	end
	local q = math.floor(a / b)
	if q * b > a then
		q = q - 1
	elseif (q + 1) * b <= a then
		q = q + 1
	end
	if neg then
		return -q
	end
	return q
end

-- units converts bucket room in µs to whole events, as Limit.wholeUnits.
local function units(room, unit)
	if room <= 0 then
		return 0
	end
	return quo(room, unit)
end

-- int formats an integral number exactly (tostring and .. keep only 14
-- digits).
local function int(n)
	return string.format('%.0f', n)
end

-- ttl is the key's time to live in ms for a state that is fresh again in
-- reset µs on the (possibly held) clock: rounded up, never shorter. A fresh
-- state gets 0, so that production deletes it.
local function ttl(reset)
	if reset <= 0 then
		return slack
	end
	return quo(reset + now - raw + 999, 1000) + slack
end

-- save writes a hash state that is fresh again in reset µs, or deletes the
-- key when it is fresh already.
local function save(reset, ...)
	local ms = ttl(reset)
	if ms <= 0 then
		redis.call('DEL', key)
		return
	end
	redis.call('HSET', key, ...)
	redis.call('PEXPIRE', key, ms)
end

-- roll brings a window state up to date with now, as Limit.roll does:
-- windows are aligned to multiples of w since the epoch, and a clock that
-- ran backwards counts as no time elapsed.
local function roll(at, level, prev, w)
	if now < at then
		now = at
	end
	local start = quo(now, w) * w
	if start > at then
		if start - at == w then
			prev = level
		else
			prev = 0
		end
		level = 0
		at = start
	end
	return at, level, prev
end

