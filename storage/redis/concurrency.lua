-- concurrency.lua: the twin of Limit.slots, with leases. The state is a
-- sorted set of the slots taken: member = lease id, score = the lease's
-- end (µs). A lease that is not renewed before its end frees its slot, so
-- that the slots of an instance that died come back within one lease.
-- x = this request's lease id (a take records it, and the decision's at
-- returns it); ta = the lease id to give back (undo) or renew ('l');
-- c1 = slots, c2 = lease in µs.
local function concurrency(key, op, now, x, ta, _, n, lease)
	if op == 'u' then
		redis.call('ZREM', key, ta)
		return nil
	end
	if op == 'l' then
		-- Renew a lease that still holds its slot; one that expired is
		-- gone, and renewing it would take a slot nobody checked.
		if redis.call('ZADD', key, 'XX', 'CH', now + lease, ta) == 1 then
			redis.call('PEXPIRE', key, ttl(lease, 0))
		end
		return nil
	end
	if op == 'p' and redis.call('EXISTS', key) == 0 then
		return nil
	end
	local live = redis.call('ZCOUNT', key, '(' .. int(now), '+inf')
	if live >= n then
		return {0, 0, 1000000, 1000000, 0, now}
	end
	if op == 't' then
		redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
		redis.call('ZADD', key, now + lease, x)
		-- Every lease ends within one lease from now.
		redis.call('PEXPIRE', key, ttl(lease, 0))
	end
	return {1, n - live - 1, 1000000, 0, 0, x}
end
algs.cc = concurrency
