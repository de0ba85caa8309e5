-- common.lua: the start of every Tollgate script. The Go code builds each
-- script from this file, the files of the algorithms it runs (each defines
-- one decision function and registers it in algs) and a main part:
-- single.lua (one key, one algorithm) or multi.lua (several zones' keys
-- decided as one request). Each decision function is the Lua twin of its
-- Go algorithm in package algorithms: the Go side passes every derived
-- constant, so that the Lua only adds, compares and divides integers below
-- 2^53, which doubles hold exactly.
--
-- A decision function is called as f(key, op, now, x, ta, tr, c1, c2, c3,
-- c4):
--
-- op:  't' take; 'r' reject (cost above capacity: decide for cost 0,
--      charge nothing, report Wait -1); 'p' peek (read only; nil for a
--      key that does not exist); 'c' check (read only, as a take would
--      decide; a key that does not exist is fresh); 'n' check a cost
--      above capacity (as 'r', read only); 'u' undo (returns nil); 'g'
--      grant x more for the window (fixed_window, sliding_window; writes,
--      and answers as a peek for one event); 'o' owe x whatever the
--      capacity (Limit.Owe, settle.lua; returns nil)
-- now: µs since the Unix epoch, as the script read it
-- x:   the request's cost as the algorithm counts it
-- ta, tr: for an undo, the At and Reset of the decision that charged what
--      is given back (0 otherwise)
-- c1, c2, c3, c4: the algorithm's constants (unused ones are 0)
--
-- and returns {allowed, remaining, reset, wait, delay, at} as integers,
-- at being the now it decided at (held when the clock ran backwards); for
-- 'p', the window algorithms add a seventh, granted: the quota granted to
-- the window in milli-units (Limit.Granted).
-- Only 't', 'r', 'u' and 'o' write.

-- Redis before 5 replicated scripts verbatim and refused writes after TIME.
if redis.replicate_commands then
	redis.replicate_commands()
end

-- algs maps an algorithm's code (tb gc sw sl fw lb, as in the Redis keys)
-- to its decision function.
local algs = {}

-- slack is ms added to every TTL (0 in production; tests add some so that
-- keys outlive a clock that tests hold still). The main part sets it.
local slack = 0

-- maxgrant is MaxGrant, the most quota a key's window can be granted
-- (op 'g' of the window algorithms): 2^40 events in milli-units.
local maxgrant = 1099511627776000

-- clock returns the now argument as a number, or, when it is negative
-- (production always passes -1), the server's clock in µs.
local function clock(arg)
	local now = tonumber(arg)
	if now < 0 then
		local t = redis.call('TIME')
		now = tonumber(t[1]) * 1000000 + tonumber(t[2])
	end
	return now
end

-- mode returns what op does: whether it charges an admitted request,
-- whether it writes the state back, and whether it reports a cost above
-- the capacity.
local function mode(op)
	return op == 't', op == 't' or op == 'r', op == 'r' or op == 'n'
end

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

-- ceildiv returns ceil(a / b) for a >= 0, b > 0, exactly.
local function ceildiv(a, b)
	local q = quo(a, b)
	if q * b < a then
		q = q + 1
	end
	return q
end

-- micros converts ticks of 1/scale µs to µs, rounding up, as
-- Limit.micros.
local function micros(ticks, scale)
	if ticks <= 0 then
		return 0
	end
	return ceildiv(ticks, scale)
end

-- int formats an integral number exactly, for a string the script builds
-- (tostring and .. keep only 14 digits). A number passed to redis.call as
-- it is needs no int: Redis formats it itself, exactly (%.17g, or as an
-- integer), in less time than string.format takes.
local function int(n)
	return string.format('%.0f', n)
end

-- ttl is the key's time to live in ms for a state that is fresh again in
-- reset µs on a clock that the algorithm holds held µs ahead of the
-- script's reading (a clock that ran backwards; TTLs run on the real
-- clock): rounded up, never shorter. A fresh state gets 0, so that
-- production deletes it, unless it holds the clock: then it is kept
-- until the clock reads the time it holds (Limit.Fresh), so that the
-- next decision is not dated earlier than the ones before.
local function ttl(reset, held)
	if reset <= 0 and held <= 0 then
		return slack
	end
	return quo(math.max(reset, 0) + held + 999, 1000) + slack
end

-- staged holds, while a lease call runs (single.lua's op 'q'), the state
-- of its key as its steps leave it: the lease's end, the request's take
-- and the lease's debit are each a decision function's call, and each
-- reads the state the one before wrote, from here; the key is read from
-- Redis once and written once, by commit, instead of once a step (a
-- lease call cost Redis about three decisions' time). nil otherwise: the
-- decision functions read and write Redis at once. Each main part sets it
-- to nil first: a function library keeps it between calls, and a call that
-- failed half-way must not leave it to the next.
--
-- staged[key] is a hash key's {f = {field = value, or false for none},
-- dirty = {the fields written, in order}, del = the key was deleted
-- first, ms = its TTL}, or a string key's (gcra's) {str = true, s = value
-- or false for none, ms = its TTL, dirty = written}; staged[1], staged[2],
-- ... are the keys, in the order they were first met.
local staged = nil

-- hget is HMGET of a hash key's fields, from staged if it holds the key.
local function hget(key, ...)
	if not staged then
		return redis.call('HMGET', key, ...)
	end
	local st = staged[key]
	local n = select('#', ...)
	if not st then
		local v = redis.call('HMGET', key, ...)
		st = {f = {}, dirty = {}, del = false}
		for i = 1, n do
			st.f[select(i, ...)] = v[i]
		end
		staged[key] = st
		staged[#staged + 1] = key
		return v
	end
	local v = {}
	for i = 1, n do
		local name = select(i, ...)
		local x = st.f[name]
		if x == nil then
			-- Neither read nor written yet: Redis holds it, unless the
			-- key was deleted since.
			x = false
			if not st.del then
				x = redis.call('HMGET', key, name)[1]
			end
			st.f[name] = x
		end
		v[i] = x
	end
	return v
end

-- save writes a hash state that is fresh again in reset µs, or deletes the
-- key when it is fresh already (into staged, if it is on).
local function save(key, reset, held, ...)
	local ms = ttl(reset, held)
	if staged then
		local st = staged[key]
		if not st then
			st = {f = {}, dirty = {}, del = false}
			staged[key] = st
			staged[#staged + 1] = key
		end
		if ms <= 0 then
			st.f, st.dirty, st.del, st.ms = {}, {}, true, nil
			return
		end
		for i = 1, select('#', ...), 2 do
			local name, x = select(i, ...)
			if not st.dirty[name] then
				st.dirty[#st.dirty + 1] = name
				st.dirty[name] = true
			end
			st.f[name] = x
		end
		st.ms = ms
		return
	end
	if ms <= 0 then
		redis.call('DEL', key)
		return
	end
	redis.call('HSET', key, ...)
	redis.call('PEXPIRE', key, ms)
end

-- sget is GET of a string key, from staged if it holds the key.
local function sget(key)
	if not staged then
		return redis.call('GET', key)
	end
	local st = staged[key]
	if not st then
		st = {str = true, s = redis.call('GET', key), dirty = false}
		staged[key] = st
		staged[#staged + 1] = key
	end
	return st.s
end

-- sput sets a string key to v for ms, or deletes it if ms <= 0 (into
-- staged, if it is on).
local function sput(key, v, ms)
	if staged then
		local st = staged[key]
		if not st then
			st = {str = true}
			staged[key] = st
			staged[#staged + 1] = key
		end
		st.dirty = true
		if ms <= 0 then
			st.s, st.ms = false, nil
		else
			st.s, st.ms = v, ms
		end
		return
	end
	if ms <= 0 then
		redis.call('DEL', key)
		return
	end
	redis.call('SET', key, v, 'PX', ms)
end

-- stage starts staging (see staged).
local function stage()
	staged = {}
end

-- commit writes what staged holds to Redis and stops staging: each key
-- once, as the last step left it.
local function commit()
	local s = staged
	staged = nil
	for _, key in ipairs(s) do
		local st = s[key]
		if st.str then
			if st.dirty then
				if st.s then
					redis.call('SET', key, st.s, 'PX', st.ms)
				else
					redis.call('DEL', key)
				end
			end
		else
			if st.del then
				redis.call('DEL', key)
			end
			local n = #st.dirty
			if n > 0 then
				local args = {}
				for i = 1, n do
					local name = st.dirty[i]
					args[2 * i - 1], args[2 * i] = name, st.f[name]
				end
				redis.call('HSET', key, unpack(args))
				redis.call('PEXPIRE', key, st.ms)
			end
		end
	end
end

-- back and leased: a lease call (single.lua's op 'q') leaves on its key
-- when the latest lease taken on it is back at the latest (back: its end
-- plus the time its instance takes to return what is left of it,
-- quota.go's returnDelay, and for a window no later than the window's
-- end; µs on the script's clock, algorithms.Limit.LeaseBack) and how many
-- events the leases taken since the one before was back hold at most
-- (leased: a lease adds its events, a return takes its events off), in
-- the fields back and leased of a hash state (algorithms.LeaseMark is
-- their Go twin). Only lease calls and returns write them; the decision
-- functions read them with their state, keep them as they found them,
-- and tell a rejection that what the leases hold could admit no later
-- than back (leasewait). gcra's state, a string, keeps none: an older
-- release sharing the server reads that string as a number, and would
-- fail on anything added to it (a hash's new fields it ignores).

-- leasewait caps the wait of d, the rejection of a request of need whole
-- events, at back when need is within what is left plus what the leases
-- hold (LeaseMark.Wait). A wait of -1 (never) stays.
local function leasewait(d, back, leased, need)
	if d[1] == 0 and d[4] > 0 and back > d[6] and back - d[6] < d[4] and need <= d[2] + leased then
		d[4] = back - d[6]
	end
	return d
end

-- leasemark changes, with f, the back and leased of key, a hash whose
-- state staged holds (read, or written by a step of the script); a state
-- that no step wrote keeps its TTL (PTTL), and one that does not exist,
-- or holds no lease mark, is left alone, as is gcra's string.
local function leasemark(key, f)
	local st = staged[key]
	if not st or st.str then
		return
	end
	local b0, l0 = tonumber(st.f.back) or 0, tonumber(st.f.leased) or 0
	local back, leased = f(b0, l0)
	if back == b0 and leased == l0 then
		return
	end
	if #st.dirty == 0 then
		if st.del or not st.f.back then
			return
		end
		local ms = redis.call('PTTL', key)
		if ms <= 0 then
			return
		end
		st.ms = ms
	end
	for _, name in ipairs({'back', 'leased'}) do
		if not st.dirty[name] then
			st.dirty[#st.dirty + 1] = name
			st.dirty[name] = true
		end
	end
	st.f.back, st.f.leased = back, leased
end

-- leasetaken records a lease of n events taken at at that is back at
-- back (LeaseMark.Take).
local function leasetaken(key, at, n, back)
	leasemark(key, function(b, leased)
		if b <= at then
			leased = 0 -- every lease taken before is back
		end
		return math.max(b, back), leased + n
	end)
end

-- leasereturned records the return of a lease of n events
-- (LeaseMark.Return).
local function leasereturned(key, n)
	leasemark(key, function(b, leased)
		return b, math.max(0, leased - n)
	end)
end

-- roll brings a window state, whose at is the latest time it has seen,
-- up to date with now, as Limit.roll does: windows are aligned to
-- multiples of w since the epoch, and a clock that ran backwards counts
-- as no time elapsed. It returns the (possibly held) now, the state's new
-- at, the start of its window, and its counts.
local function roll(now, at, level, prev, w)
	if now < at then
		now = at
	end
	local start = quo(now, w) * w
	if start > at then
		if start - at <= w then -- at was in the window before
			prev = level
		else
			prev = 0
		end
		level = 0
	end
	return now, start, level, prev
end

-- owe is algorithms' owe: level + x, capped at OwedCap (2^50) or at level
-- if it holds more already (op 'o', the excess of a settlement).
local function owe(level, x)
	return math.min(level + x, math.max(level, 1125899906842624))
end
