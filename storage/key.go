package storage

import (
	"net/netip"
	"strings"
)

// MaskIP masks key to its network if it is an IP address: an IPv4 address
// (also one mapped into IPv6) to v4bits, an IPv6 address to v6bits. An
// address kept whole is returned as it is (an IPv4-mapped one unmapped),
// without allocating for a plain IPv4 key; a masked one is written as a
// prefix, such as "2001:db8::/64".
func MaskIP(key string, v4bits, v6bits int) string {
	if v4bits == 32 && strings.IndexByte(key, ':') < 0 {
		return key // not IPv6, and IPv4 kept whole
	}
	ip, err := netip.ParseAddr(key)
	if err != nil {
		return key
	}
	bits := v6bits
	if ip.Is4() || ip.Is4In6() {
		ip, bits = ip.Unmap(), v4bits
		if bits == 32 {
			return ip.String()
		}
	} else if bits == 128 {
		return key
	}
	p, err := ip.Prefix(bits)
	if err != nil {
		return key
	}
	return p.String()
}

// StoredKey is the key a zone stores for a resolved key: grouped by the
// zone's IP prefixes (see MaskIP) and bounded (see BoundKey). A key with
// a colon may be an IPv4-mapped address, unmapped even when both prefixes
// keep addresses whole.
func StoredKey(key string, v4bits, v6bits int) string {
	if v4bits < 32 || v6bits < 128 || strings.IndexByte(key, ':') >= 0 {
		key = MaskIP(key, v4bits, v6bits)
	}
	return BoundKey(key)
}
