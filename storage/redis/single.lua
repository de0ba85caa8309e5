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
-- A quota lease (see algorithms/lease.go) is op 'q' or 'e', KEYS[2] the
-- key's reset mark:
-- 'q' decides a take of x (ARGV[4]) and, if admitted, leases up to want
--     (ARGV[5]) events for life (ARGV[6]) µs, after ending the lease
--     ARGV[12..14] (unspent events, taken, life; taken 0: none) as 'e'
--     does; it returns the decision, the events leased and the lease's
--     life (Limit.LeaseTake). The lease ended, of ARGV[16] events, comes
--     off the key's leased (also when there is nothing to give back:
--     taken 0); the one taken goes on it, and is back (see
--     common.lua) at its end plus ARGV[15] µs, the time its instance
--     takes to return it, and no later than its window's end
--     (Limit.LeaseBack).
-- 'e' ends a lease of ARGV[12] events taken at ta (ARGV[5]) that lived
--     tr (ARGV[6]) µs with x unspent events (Limit.LeaseEnd), and takes
--     it off the key's leased: nothing if the key was reset at or after
--     ta; returns {}.
--
-- It returns the decision, or {} for an undo and for a peek at a key that
-- does not exist, or for a reset {1} if it deleted the key, {0} if there
-- was none, or for a grant whose id was applied already {-1} (nothing
-- changed: the id is set, in the same script, only by the grant it
-- names).
--
-- A reset deletes the key and marks the time it did so in KEYS[2] (if
-- the clock ran backwards, a µs after the latest time its state had
-- seen: storage.ResetAt): an undo of a charge made at or before the mark
-- gives nothing back (the reset gave it back), so that it cannot take
-- from what the key was charged since; nor is an excess settled ('o')
-- for a charge made before it (the reset forgave it). The mark is kept
-- as long as a charge counts (storage.Horizon). A bucket or an epoch
-- window reset on a clock that ran back is left a fresh state that holds
-- the clock a µs after the mark (Limit.HeldAt), until the clock reaches
-- it: a decision since is dated after the reset.
slack = tonumber(ARGV[3])
staged = nil -- see common.lua
local op = ARGV[1]
if op == 'g' and KEYS[2] then
	if not redis.call('SET', KEYS[2], 1, 'NX', 'PX', tonumber(ARGV[12]) + slack) then
		return {-1}
	end
end
if op == 'q' then
	local now = clock(ARGV[2])
	local code = ARGV[7]
	local f = algs[code]
	local c1, c2, c3, c4 = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])
	-- Its steps (end, take, debit) read and write the key through staged:
	-- one read and one write in all.
	stage()
	local taken = tonumber(ARGV[13])
	if taken > 0 then
		local mark = KEYS[2] and tonumber(redis.call('GET', KEYS[2]))
		if not (mark and taken <= mark) then
			f(KEYS[1], 'e', now, tonumber(ARGV[12]), taken, tonumber(ARGV[14]), c1, c2, c3, c4)
		end
	end
	local d = f(KEYS[1], 't', now, tonumber(ARGV[4]), 0, 0, c1, c2, c3, c4)
	-- The take wrote the state: the lease ended comes off leased.
	leasereturned(KEYS[1], tonumber(ARGV[16]))
	local want, life = tonumber(ARGV[5]), tonumber(ARGV[6])
	d[7], d[8] = 0, 0
	if d[1] ~= 1 or want <= 0 or life <= 0 then
		commit()
		return d
	end
	local window = code == 'fw' or code == 'fc' or code == 'sw'
	-- Limit.leaseLife, leaseRoom, LeaseSize and LeaseDebit: a bucket's c2
	-- is its unit, c4 its scale.
	local room = d[2]
	if not window then
		life = math.min(life, quo(math.max(room, 0) * c2, 2 * c4))
		room = room - ceildiv(life * c4, c2)
	end
	local n = math.min(want, quo(math.max(room, 0), 8))
	if n < 2 or life <= 0 then
		commit()
		return d
	end
	local debit = n * 1000
	if not window then
		debit = n * c2 + life * c4
	end
	local after = f(KEYS[1], 't', d[6], debit, 0, 0, c1, c2, c3, c4)
	if after[1] ~= 1 then
		commit()
		return d
	end
	-- The µs to the window's end (a fixed_window's Reset, once charged).
	local wend = nil
	if code == 'sw' then
		wend = c1 - (after[6] - quo(after[6], c1) * c1)
	elseif window then
		wend = after[3]
	end
	if wend then
		life = math.min(life, wend)
	end
	local back = after[6] + life + tonumber(ARGV[15])
	if wend then
		back = math.min(back, after[6] + wend)
	end
	leasetaken(KEYS[1], after[6], n, back)
	commit()
	d[2], d[3], d[7], d[8] = after[2] + n, after[3], n, life
	return d
end
if (op == 'x' or op == 'u' or op == 'o' or op == 'e') and KEYS[2] then
	local mark = tonumber(redis.call('GET', KEYS[2]))
	if op == 'x' then
		-- storage.ResetAt: dated now, or the last mark if later, or, if
		-- the state has seen a later time still (the clock ran back),
		-- one µs after it, and a bucket's or an epoch window's fresh
		-- state then holds the clock one µs later still (Limit.HeldAt),
		-- for as long as the clock reads before it.
		local now = clock(ARGV[2])
		local code = ARGV[7]
		local d = algs[code](KEYS[1], 'p', now, 0, 0, 0,
			tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11]))
		local at = now
		if mark and mark > at then
			at = mark
		end
		local hold = at
		if d and d[6] > at then
			at = d[6] + 1
			hold = at + 1
		end
		redis.call('SET', KEYS[2], at, 'PX', tonumber(ARGV[4]) + slack)
		local n = redis.call('DEL', KEYS[1])
		if n == 1 and hold > now and (code == 'tb' or code == 'lb' or code == 'fw' or code == 'sw') then
			redis.call('HSET', KEYS[1], 'at', hold, 'level', 0)
			redis.call('PEXPIRE', KEYS[1], quo(hold - now + 999, 1000) + slack)
		end
		return {n}
	end
	-- At the mark's very µs the charge may have come before the reset or
	-- after: a give-back then gives nothing (it must not mint), an
	-- excess is owed (it must not be forgiven).
	local ta = tonumber(ARGV[5])
	if mark and ((op == 'u' or op == 'e') and ta <= mark or op == 'o' and ta < mark) then
		return {} -- reset since: the reset gave back, and forgave, the charge
	end
	if op == 'e' then
		stage()
		algs[ARGV[7]](KEYS[1], 'e', clock(ARGV[2]), tonumber(ARGV[4]), ta, tonumber(ARGV[6]),
			tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11]))
		leasereturned(KEYS[1], tonumber(ARGV[12]))
		commit()
		return {}
	end
end
return algs[ARGV[7]](KEYS[1], ARGV[1], clock(ARGV[2]), tonumber(ARGV[4]),
	tonumber(ARGV[5]), tonumber(ARGV[6]),
	tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])) or {}
