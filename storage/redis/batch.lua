-- batch.lua: the main part of the library's batch function, after
-- common.lua and every algorithm's file: several one-key decisions, each
-- decided exactly as single.lua decides it, one after another in one call.
-- The batcher sends the one-key calls of a batch this way to a single
-- server (standalone or Sentinel's primary), which then parses, looks up
-- and answers one command instead of one per decision, and reads its clock
-- once (every decision of the call is made at the same instant).
--
-- KEYS[i]:                 decision i's key
-- ARGV[11(i-1)+1 .. 11i]:  decision i's ARGV, as single.lua takes them
--
-- It returns, for each decision in turn, the number of integers of its
-- reply followed by that reply (0 for single.lua's {}), or -1 alone for a
-- decision that raised an error: the caller runs that one again on its
-- own to learn the error. A decision's error stops no other decision.
local out, n, server = {}, 0, nil
for i = 1, #KEYS do
	local a = 11 * (i - 1)
	local now = tonumber(ARGV[a + 2])
	if now < 0 then
		server = server or clock(ARGV[a + 2])
		now = server
	end
	slack = tonumber(ARGV[a + 3])
	local ok, d = pcall(algs[ARGV[a + 7]], KEYS[i], ARGV[a + 1], now, tonumber(ARGV[a + 4]),
		tonumber(ARGV[a + 5]), tonumber(ARGV[a + 6]),
		tonumber(ARGV[a + 8]), tonumber(ARGV[a + 9]), tonumber(ARGV[a + 10]), tonumber(ARGV[a + 11]))
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
