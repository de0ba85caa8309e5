-- multi.lua: the main part of the script that decides one request against
-- several zones (TakeAll), after common.lua and every algorithm's file. All
-- of its keys are in one Cluster slot, and it reads the clock once, so that
-- every zone decides at the same now.
--
-- KEYS:         the zones' keys, one per zone, all different
-- ARGV[1] what: 'd' decide: check every zone and, if no blocking zone
--               rejects, take in every admitting zone; 'c' check only
-- ARGV[2] now:  µs since the Unix epoch; negative means the server's clock
-- ARGV[3]:      TTL slack in ms
-- ARGV[4...]:   10 arguments for each key: op ('c' check; 'n' check a
--               cost above the capacity; 'u' undo x, then check), x,
--               blocking ('1', or '0' for a dry-run zone, whose rejection
--               does not stop the others), ta and tr (for an undo, see
--               common.lua), the algorithm's code and its 4 constants
--
-- It returns the zones' decisions one after another, 6 integers each: the
-- checks' when nothing was taken, the takes' (for the zones that admitted)
-- when the request was.
local what = ARGV[1]
local now = clock(ARGV[2])
slack = tonumber(ARGV[3])

local per = 10

local function run(i, op)
	local a = 4 + per * (i - 1)
	return algs[ARGV[a + 5]](KEYS[i], op, now, tonumber(ARGV[a + 1]),
		tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]),
		tonumber(ARGV[a + 6]), tonumber(ARGV[a + 7]), tonumber(ARGV[a + 8]), tonumber(ARGV[a + 9]))
end

local ds = {}
local admit = true
for i = 1, #KEYS do
	local a = 4 + per * (i - 1)
	local op = ARGV[a]
	if op == 'u' then
		run(i, 'u')
		op = 'c'
	end
	local d = run(i, op)
	if d[1] == 0 and ARGV[a + 2] == '1' then
		admit = false
	end
	ds[i] = d
end
-- Decided on the same state at the same now, a take admits exactly when
-- its check did.
if what == 'd' and admit then
	for i = 1, #KEYS do
		if ds[i][1] == 1 then
			ds[i] = run(i, 't')
		end
	end
end

local out = {}
for i = 1, #KEYS do
	local d = ds[i]
	for j = 1, 6 do
		out[6 * (i - 1) + j] = d[j]
	end
end
return out
