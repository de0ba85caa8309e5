-- single.lua: the main part of a one-key script (Zone's Take, Undo and
-- Peek), after common.lua and the algorithm's file.
--
-- KEYS[1]:      the key
-- ARGV[1] op:   as in common.lua ('t', 'r', 'p' or 'u')
-- ARGV[2] now:  µs since the Unix epoch; negative means the server's clock
-- ARGV[3]:      TTL slack in ms
-- ARGV[4] x:    the request's cost as the algorithm counts it
-- ARGV[5, 6]:   ta and tr, for an undo (see common.lua)
-- ARGV[7]:      the algorithm's code; ARGV[8..11] its constants
--
-- It returns the decision, or {} for an undo and for a peek at a key that
-- does not exist.
slack = tonumber(ARGV[3])
return algs[ARGV[7]](KEYS[1], ARGV[1], clock(ARGV[2]), tonumber(ARGV[4]),
	tonumber(ARGV[5]), tonumber(ARGV[6]),
	tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])) or {}
