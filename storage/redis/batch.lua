-- batch.lua: the main part of the library's batch function, after
-- common.lua and every algorithm's file: several one-key decisions, each
-- decided exactly as single.lua decides it, one after another in one call.
-- The batcher sends the one-key calls of a batch this way to a single
-- server (standalone or Sentinel's primary), which then parses, looks up
-- and answers one command instead of one per decision, and reads its clock
-- once (every decision of the call is made at the same instant).
--
-- The decisions of one zone share all but their op and x (single.lua's
-- ARGV[2, 3, 5, 6, 7..11]: now, slack, ta, tr, the algorithm and its
-- constants): those go once per call, as a profile that decisions name.
--
-- KEYS[i]:                      decision i's key (n keys)
-- ARGV[3(i-1)+1 .. 3i]:         decision i's op, x and profile number p
-- ARGV[3n+9(p-1)+1 .. 3n+9p]:   profile p: now, slack, ta, tr, the
--                               algorithm's code and its 4 constants
--
-- It returns, for each decision in turn, the number of integers of its
-- reply followed by that reply (0 for single.lua's {}), or -1 alone for a
-- decision that raised an error: the caller runs that one again on its
-- own to learn the error. A decision's error stops no other decision.
local out, n, server = {}, 0, nil
staged = nil -- see common.lua

-- num is tonumber, remembered for the call: the decisions of one zone pass
-- the same constants, and a table lookup costs a fraction of tonumber.
local nums = {}
local function num(s)
	local v = nums[s]
	if v == nil then
		v = tonumber(s)
		nums[s] = v
	end
	return v
end

local keys = #KEYS
for i = 1, keys do
	local a = 3 * (i - 1)
	local p = 3 * keys + 9 * (num(ARGV[a + 3]) - 1)
	local now = num(ARGV[p + 1])
	if now < 0 then
		server = server or clock(ARGV[p + 1])
		now = server
	end
	slack = num(ARGV[p + 2])
	local ok, d = pcall(algs[ARGV[p + 5]], KEYS[i], ARGV[a + 1], now, num(ARGV[a + 2]),
		num(ARGV[p + 3]), num(ARGV[p + 4]),
		num(ARGV[p + 6]), num(ARGV[p + 7]), num(ARGV[p + 8]), num(ARGV[p + 9]))
	if not ok then
		n = n + 1
		out[n] = -1
	else
		d = d or {}
		n = n + 1
		out[n] = #d
		for j = 1, #d do
			out[n + j] = d[j]
		end
		n = n + #d
	end
end
return out
