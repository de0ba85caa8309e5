-- renew.lua: the main part of the script that renews many concurrency
-- leases at once (the store's lease keeper, once per tick), after
-- common.lua and concurrency.lua. Each lease is renewed exactly as
-- single.lua renews one (op 'l'): a lease that still holds its slot runs
-- a whole lease from now; one that expired stays gone. All of its keys
-- are on one server, in one Cluster slot.
--
-- KEYS[i]:             lease i's key (a concurrency zone's sorted set)
-- ARGV[1] now:         µs since the Unix epoch; negative means the server's clock
-- ARGV[2]:             TTL slack in ms
-- ARGV[2i+1, 2i+2]:    lease i's id and its zone's lease in µs
--
-- It returns {renewed}: how many leases still held their slot (had not
-- ended).
local now = clock(ARGV[1])
slack = tonumber(ARGV[2])
local renewed = 0
for i = 1, #KEYS do
	local id, lease = tonumber(ARGV[2 * i + 1]), tonumber(ARGV[2 * i + 2])
	local ends = redis.call('ZSCORE', KEYS[i], id)
	if ends and tonumber(ends) > now then
		renewed = renewed + 1
	end
	algs.cc(KEYS[i], 'l', now, 0, id, 0, 0, lease)
end
return {renewed}
