-- multi.lua: the main part of the script that decides one request against
-- several zones (TakeAll), after common.lua and every algorithm's file. All
-- of its keys are in one Cluster slot, and it reads the clock once, so that
-- every zone decides at the same now.
--
-- KEYS:         the zones' keys, one per zone, all different; when giving
--               back, then each one's reset mark (see single.lua)
-- ARGV[1] what: 'd' decide: check every zone and, if no blocking zone
--               rejects, take in every admitting zone; 'c' check only;
--               's' check, and strike the bans (see below)
-- ARGV[2] now:  µs since the Unix epoch; negative means the server's clock
-- ARGV[3]:      TTL slack in ms
-- ARGV[4...]:   11 arguments for each key: op ('c' check; 'n' check a
--               cost above the capacity; 'u' undo x, then check; 'k' not
--               decided, as a banned key; 'm' the same for a cost above
--               the capacity), x,
--               blocking ('1', or '0' for a dry-run zone, whose rejection
--               does not stop the others), ta and tr (for an undo, see
--               common.lua), the algorithm's code, its 4 constants, and
--               the index of the key's ban (an earlier key of code 'bn',
--               or 0 for none)
--
-- It returns the zones' decisions one after another, 6 integers each: the
-- checks' when nothing was taken, the takes' (for the zones that admitted)
-- when the request was. A key whose ban holds is not decided: its decision
-- is an empty admission, and the ban's rejection stands for it, its wait
-- until the key's rate (checked, not charged) admits too. When
-- deciding ('d' or 's'), each ban that does not hold then gets one strike if a
-- key linked to it was rejected, and its decision is the one after the
-- strike.
local what = ARGV[1]
local now = clock(ARGV[2])
slack = tonumber(ARGV[3])
staged = nil -- see common.lua

local per = 11
local zones = (#ARGV - 3) / per

local function run(i, op)
	local a = 4 + per * (i - 1)
	return algs[ARGV[a + 5]](KEYS[i], op, now, tonumber(ARGV[a + 1]),
		tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]),
		tonumber(ARGV[a + 6]), tonumber(ARGV[a + 7]), tonumber(ARGV[a + 8]), tonumber(ARGV[a + 9]))
end

local ds = {}
local skipped = {}
local admit = true
for i = 1, zones do
	local a = 4 + per * (i - 1)
	local op = ARGV[a]
	if op == 'u' then
		-- Nothing to give back of a charge made before the key's reset:
		-- the reset gave it back.
		local mark = KEYS[zones + i] and tonumber(redis.call('GET', KEYS[zones + i]))
		if not (mark and tonumber(ARGV[a + 3]) <= mark) then
			run(i, 'u')
		end
		op = 'c'
	end
	local ban = tonumber(ARGV[a + 10])
	-- A key whose ban holds is not decided ('k' or 'm' says so when checking
	-- again, after giving back: that check reports what the request's
	-- first run saw, before any ban that run started).
	if op == 'k' or op == 'm' or (ban > 0 and ds[ban][1] == 0 and what ~= 'c') then
		if ban > 0 and ds[ban][1] == 0 and ARGV[a + 5] ~= 'cc' then
			-- The ban's wait covers the rate's (Decision.WaitAlso): the
			-- rate checked, nothing charged.
			if op == 'k' then
				op = 'c'
			elseif op == 'm' then
				op = 'n'
			end
			local b, r = ds[ban], run(i, op)
			if r[1] == 0 then
				if r[4] == -1 or b[4] == -1 then
					b[4] = -1
				elseif r[4] > b[4] then
					b[4] = r[4]
				end
			end
		end
		skipped[i] = true
		ds[i] = {1, 0, 0, 0, 0, 0}
	else
		ds[i] = run(i, op)
		if ds[i][1] == 0 and ARGV[a + 2] == '1' then
			admit = false
		end
	end
end
-- Decided on the same state at the same now, a take admits exactly when
-- its check did.
if what == 'd' and admit then
	for i = 1, zones do
		if ds[i][1] == 1 and not skipped[i] then
			ds[i] = run(i, 't')
		end
	end
end

if what == 'd' or what == 's' then
	for b = 1, zones do
		if ARGV[4 + per * (b - 1) + 5] == 'bn' and ds[b][1] == 1 then
			for j = b + 1, zones do
				if tonumber(ARGV[4 + per * (j - 1) + 10]) == b and ds[j][1] == 0 then
					ds[b] = run(b, 's')
					break
				end
			end
		end
	end
end

local out = {}
for i = 1, zones do
	local d = ds[i]
	for j = 1, 6 do
		out[6 * (i - 1) + j] = d[j]
	end
end
return out
