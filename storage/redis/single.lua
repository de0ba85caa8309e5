-- single.lua: the main part of a one-key script (Zone's Take, Undo and
-- Peek), after common.lua and the algorithm's file.
--
-- KEYS[1]:      the key
-- KEYS[2]:      for 'u', 'o' and 'x', the key's reset mark (in KEYS[1]'s slot);
--               for 'g', the grant's id key, if it has an id (idem)
-- ARGV[1] op:   as in common.lua ('t', 'r', 'p', 'u', 'o', 'g'), or 'x' reset
-- ARGV[2] now:  µs since the Unix epoch; negative means the server's clock
-- ARGV[3]:      TTL slack in ms
-- ARGV[4] x:    the request's cost as the algorithm counts it; for a
--               reset, how long its mark is kept, in ms
-- ARGV[5, 6]:   ta and tr, for an undo (see common.lua)
-- ARGV[7]:      the algorithm's code; ARGV[8..11] its constants
-- ARGV[12]:     for 'g' with an id key, how long the id is kept, in ms
--
-- It returns the decision, or {} for an undo and for a peek at a key that
-- does not exist, or for a reset {1} if it deleted the key, {0} if there
-- was none, or for a grant whose id was applied already {-1} (nothing
-- changed: the id is set, in the same script, only by the grant it
-- names).
--
-- A reset deletes the key and marks the time it did so (the time its
-- state held, if the clock ran backwards) in KEYS[2]: an undo of a charge
-- made at or before the mark gives nothing back (the reset gave it back),
-- so that it cannot take from what the key was charged since; nor is an
-- excess settled ('o') for a charge made before it (the reset forgave it). The mark
-- is kept as long as a charge counts (storage.Horizon).
slack = tonumber(ARGV[3])
local op = ARGV[1]
if op == 'g' and KEYS[2] then
	if not redis.call('SET', KEYS[2], 1, 'NX', 'PX', tonumber(ARGV[12]) + slack) then
		return {-1}
	end
end
if (op == 'x' or op == 'u' or op == 'o') and KEYS[2] then
	local mark = tonumber(redis.call('GET', KEYS[2]))
	if op == 'x' then
		local now = clock(ARGV[2])
		local d = algs[ARGV[7]](KEYS[1], 'p', now, 0, 0, 0,
			tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11]))
		if d and d[6] > now then
			now = d[6]
		end
		if mark and mark > now then
			now = mark
		end
		redis.call('SET', KEYS[2], now, 'PX', tonumber(ARGV[4]) + slack)
		return {redis.call('DEL', KEYS[1])}
	end
	-- At the mark's very µs the charge may have come before the reset or
	-- after: a give-back then gives nothing (it must not mint), an
	-- excess is owed (it must not be forgiven).
	local ta = tonumber(ARGV[5])
	if mark and (op == 'u' and ta <= mark or op == 'o' and ta < mark) then
		return {} -- reset since: the reset gave back, and forgave, the charge
	end
end
return algs[ARGV[7]](KEYS[1], ARGV[1], clock(ARGV[2]), tonumber(ARGV[4]),
	tonumber(ARGV[5]), tonumber(ARGV[6]),
	tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])) or {}
