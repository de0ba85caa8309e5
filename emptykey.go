package tollgate

import (
	"sync/atomic"

	"go.uber.org/zap"
)

// emptyKeyHint is what the empty-key warning tells the operator to do.
const emptyKeyHint = "every request whose key is empty shares one limit. " +
	"If the key comes from authentication ({http.auth.user.*}, or a header that forward_auth copies), " +
	"rate_limit runs before it by default: put the authentication and rate_limit in one route block, " +
	"authentication first, or order rate_limit after it; " +
	"else check the placeholder's name ({client_ip}, {remote_host}; {remote_ip} and {http.request.remote_ip} are not Caddy placeholders)"

// emptyKeyWarning logs, once per zone, that the zone's key resolved to
// the empty string on a request the zone applies to: a placeholder that
// is not set yet (authentication runs later) or not a placeholder at all.
// It is safe for concurrent use; the zero value has not warned.
type emptyKeyWarning struct {
	warned atomic.Bool
}

// note logs the warning for zone z unless it has been logged already.
// The caller checks that the key is empty, so that the request path
// reaches here only when it is.
func (w *emptyKeyWarning) note(logger *zap.Logger, z *zone) {
	if w.warned.Load() || !w.warned.CompareAndSwap(false, true) {
		return
	}
	logger.Warn("rate limit key resolved empty",
		zap.String("zone", z.name),
		zap.String("key", z.key),
		zap.String("hint", emptyKeyHint))
}
